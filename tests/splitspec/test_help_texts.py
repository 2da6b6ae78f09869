"""Every flag of every command a user runs (splitspec and its subcommands serve, up and
import-gguf; splitspec-verifier, -gateway, -proposer and -health) has a help text that shows its
default exactly once; an on/off flag says whether it is on or off by default. Negative controls:
tests/splitspec/test_help_text_controls.py."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from gateway.config import GatewayConfig
from proposer_service.config import ProposerConfig
from splitspec.launcher import up
from splitspec.launcher.cli import build_parser
from splitspec.telemetry import config as telemetry
from verifier_service.config import VerifierConfig

DEFAULT = re.compile(r"\bdefault:")
SWITCHES = (argparse.BooleanOptionalAction, argparse._StoreTrueAction,
            argparse._StoreFalseAction)


def entry_points() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, built as its main() builds it: the reference generator's own list
    (scripts/gen_reference.py), so the reference and this test walk the same commands."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "gen_reference.py"
    spec = importlib.util.spec_from_file_location("gen_reference_for_help", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.entry_points()


def help_problems(parser: argparse.ArgumentParser, name: str) -> list[str]:
    """One line per flag of `parser` (and of its subcommands) whose help breaks the rule."""
    problems = []
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                problems += help_problems(sub, f"{name} {command}")
            continue
        flag = f"{name} {'/'.join(action.option_strings) or action.dest}"
        if not action.help or action.help == argparse.SUPPRESS:
            problems.append(f"{flag}: no help text")
            continue
        text = formatter._expand_help(action)
        shown = len(DEFAULT.findall(text))
        if not action.option_strings or action.required:  # nothing to default to
            if shown:
                problems.append(f"{flag}: a required argument shows a default: {text!r}")
            continue
        if shown != 1:
            problems.append(f"{flag}: shows its default {shown} times: {text!r}")
        elif isinstance(action, SWITCHES):
            said = re.search(r"\bdefault: (on|off)\b", text)
            if said is None:
                problems.append(f"{flag}: an on/off flag that says neither: {text!r}")
            elif isinstance(action.default, bool) and said[1] != (
                    "on" if action.default else "off"):
                problems.append(f"{flag}: says {said[1]}, default is {action.default}")
    return problems


def check_help_texts() -> None:
    problems = [p for name, parser in entry_points().items() for p in help_problems(parser, name)]
    assert not problems, "\n".join(problems)


def test_every_flag_has_help_showing_its_default_once():
    check_help_texts()


def test_every_command_is_walked():
    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"serve", "up", "import-gguf"} <= set(commands)
    assert not help_problems(commands["serve"], "serve")


def test_the_example_flags_in_up_help_are_flags_those_services_take():
    """--gateway-args, --verifier-args and --proposer-args show examples each service parses."""
    for service, cls, port in (("gateway", GatewayConfig, 9400),
                               ("verifier", VerifierConfig, 9401),
                               ("proposer", ProposerConfig, 9402)):
        telemetry.service_parser(cls, port).parse_args(shlex.split(up.EXAMPLE_ARGS[service]))


@pytest.mark.parametrize("flag", ["--served-model-name", "--tls-client-cert",
                                  "--tensor-parallel-address"])
def test_a_default_explained_in_words_is_not_shown_again(flag):
    parser = entry_points()["splitspec-verifier"]
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    assert len(DEFAULT.findall(action.help)) == 1, action.help
