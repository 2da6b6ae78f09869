"""`splitspec serve MODEL ...` is an `splitspec up` command line under vLLM's flag names: the
same StackConfig and the same service command lines as the `up` flags it stands for, no process
started. The stack it serves is tests/integration/test_serve.py's."""

from __future__ import annotations

import os
import re
import shlex
import stat
from pathlib import Path

import pytest

from splitspec.launcher import serve
from splitspec.launcher.cli import build_parser, main
from splitspec.launcher.stack import Stack
from splitspec.launcher.up import stack_config
from verifier_service.config import VerifierConfig

ROOT = Path(__file__).resolve().parents[2]
TARGET = str(ROOT / "models/target")  # the toy family: draft, speculator, EAGLE head beside it
ALONE = str(ROOT / "tests/fixtures/tiny-llama")  # a target with no model beside it


def served(*argv: str, key_file: str | None = None):
    args = build_parser().parse_args(["serve", *argv])
    return stack_config(serve.up_namespace(args, key_file))


def upped(*argv: str):
    return stack_config(build_parser().parse_args(["up", *argv]))


def argvs(config) -> dict[str, list[str]]:
    return {s.name: s.argv for s in Stack(config).services}


def test_serve_model_is_up_with_that_model():
    assert served(TARGET) == upped("--model", TARGET)
    assert argvs(served(TARGET)) == argvs(upped("--model", TARGET))


def test_vllms_flags_are_the_services_own():
    vllm = served(TARGET, "--host", "0.0.0.0", "--port", "8123", "--served-model-name", "toy",
                  "--dtype", "half", "--max-model-len", "512", "-tp", "2",
                  "--gpu-memory-utilization", "0.8", "--no-enable-prefix-caching",
                  "--enforce-eager", "--seed", "7", "-q", "int8", "--max-num-seqs", "16",
                  "--max-num-batched-tokens", "512",
                  "--block-size", "32", "--trust-remote-code", "--tls",
                  "--verifier-replicas", "2", "--verifier-args", "--max-waiting 9",
                  key_file="/tmp/keys")
    verifier = ("--served-model-name toy --dtype float16 --trust-remote-code --max-model-len 512 "
                "--gpu-memory-utilization 0.8 --graphs off --seed 7 --quantization int8 "
                "--max-num-seqs 16 "
                "--max-num-batched-tokens 512 --block-size 32 --max-waiting 9")
    up = upped("--model", TARGET, "--host", "0.0.0.0", "--http-port", "8123",
               "--tensor-parallel-size", "2", "--no-enable-prefix-caching", "--tls",
               "--verifier-replicas", "2", "--verifier-args", verifier,
               "--gateway-args", "--api-key-file /tmp/keys",
               "--draft-args", "--dtype float16 --trust-remote-code",
               "--mlp-args", "--dtype float16 --trust-remote-code")
    assert vllm == up
    assert argvs(vllm) == argvs(up)


def test_vllms_tool_flags_go_to_the_verifier_and_the_gateway():
    vllm = served(TARGET, "--chat-template", "chatml_tools", "--enable-auto-tool-choice",
                  "--tool-call-parser", "hermes")
    up = upped("--model", TARGET, "--verifier-args", "--chat-template chatml_tools",
               "--gateway-args", "--enable-auto-tool-choice --tool-call-parser hermes")
    assert vllm == up and argvs(vllm) == argvs(up)


def test_speculative_config_is_the_up_flags_it_stands_for():
    """The example of the docs: only the n-gram proposer, k at most 5 (lookahead's window
    narrowed to fit it), the gateway's queue-size rule."""
    vllm = served(TARGET, "--speculative-config",
                  '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, '
                  '"disable_by_batch_size": 32}')
    up = upped("--model", TARGET, "--no-draft", "--no-mlp", "--no-suffix", "--no-eagle",
               "--verifier-args", "--max-num-speculative-tokens 5 "
               "--default-num-speculative-tokens 5 --lookahead-window 2 --lookahead-ngram 3",
               "--gateway-args", "--speculative-disable-queue-size 32",
               "--ngram-args", "--max-num-speculative-tokens 5 --ngram-min 4 --ngram-max 4")
    assert vllm == up
    assert argvs(vllm) == argvs(up)
    assert set(vllm.launched()) == {"ngram"}


def test_a_model_backed_method_takes_its_model_or_the_one_beside_the_target(tmp_path):
    found = served(TARGET, "--speculative-config", '{"method": "draft_model"}')
    assert set(found.launched()) == {"draft"}
    assert found.launched()["draft"].model == str(ROOT / "models/draft")
    given = served(TARGET, "--speculative-config",
                   f'{{"method": "draft_model", "model": "{tmp_path}", '
                   '"draft_tensor_parallel_size": 2}')
    assert given.launched()["draft"].model == str(tmp_path)
    assert given.launched()["draft"].args[-2:] == ["--tensor-parallel-size", "2"]
    eagle = served(TARGET, "--speculative-config", f'{{"method": "eagle3", "model": "{tmp_path}"}}')
    assert (eagle.launched(), eagle.in_target_models) == ({}, {"eagle": str(tmp_path)})


def test_a_speculators_head_brings_its_speculative_tokens_as_vllm_takes_them(tmp_path):
    """A speculators-format EAGLE head's config names how many tokens it drafts
    (speculators_config.proposal_methods): without num_speculative_tokens that is k, as vLLM
    reads it; given, num_speculative_tokens wins."""
    head = str(ROOT / "tests/fixtures/speculators-eagle3")  # speculative_tokens 3
    implied = served(TARGET, "--speculative-config", f'{{"method": "eagle3", "model": "{head}"}}')
    given = served(TARGET, "--speculative-config",
                   f'{{"method": "eagle3", "model": "{head}", "num_speculative_tokens": 3}}')
    assert implied == given and argvs(implied) == argvs(given)
    assert "--default-num-speculative-tokens 3" in shlex.join(argvs(implied)["verifier"])
    five = served(TARGET, "--speculative-config",
                  f'{{"method": "eagle3", "model": "{head}", "num_speculative_tokens": 5}}')
    assert "--default-num-speculative-tokens 5" in shlex.join(argvs(five)["verifier"])
    plain = served(TARGET, "--speculative-config", f'{{"method": "eagle3", "model": "{tmp_path}"}}')
    assert "--default-num-speculative-tokens" not in shlex.join(argvs(plain)["verifier"])


def test_own_switches_add_to_the_speculative_config():
    both = served(TARGET, "--speculative-config", '{"method": "ngram"}', "--suffix")
    assert set(both.launched()) == {"ngram", "suffix"}


@pytest.mark.parametrize("argv, said", [
    ([ALONE, "--speculative-config", '{"method": "eagle"}'], "method 'eagle' needs its 'model'"),
    ([TARGET, "--speculative-config", '{"method": "ngram"}', "--no-ngram"],
     "--no-ngram turns off"),
    ([TARGET, "--speculative-config", '{"method": "draft_model", "model": "a"}',
      "--draft-model", "b"], "give it once"),
])
def test_contradictions_are_refused(argv, said):
    args = build_parser().parse_args(["serve", *argv])
    with pytest.raises(ValueError, match=said):
        serve.up_namespace(args)


@pytest.mark.parametrize("config, said", [
    ('{"method": "ngram", "num_speculative_tokens": 0}', "'num_speculative_tokens'"),
    ('{"method": "ngram", "typo": 1}', "unknown key 'typo'"),
])
def test_a_bad_speculative_config_exits_2_naming_the_key(capsys, config, said):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", TARGET, "--speculative-config", config])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--speculative-config" in err and said in err, err


def test_a_contradiction_exits_2_before_anything_starts(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", TARGET, "--speculative-config", '{"method": "ngram"}', "--no-ngram"])
    assert exit_.value.code == 2
    assert "--no-ngram" in capsys.readouterr().err


def test_api_keys_come_from_the_flag_else_the_environment():
    args = build_parser().parse_args(["serve", TARGET])
    assert serve.api_keys(args, {}) == []
    assert serve.api_keys(args, {serve.API_KEY_ENV: "k1"}) == ["k1"]
    args = build_parser().parse_args(["serve", TARGET, "--api-key", "a", "--api-key", "b"])
    assert serve.api_keys(args, {serve.API_KEY_ENV: "k1"}) == ["a", "b"]
    for bad in ("two words", "#comment", " "):
        args = build_parser().parse_args(["serve", TARGET, "--api-key", bad])
        with pytest.raises(ValueError, match="--api-key"):
            serve.api_keys(args, {})


def test_the_key_file_is_the_users_alone_and_read_by_the_gateway():
    from gateway.auth import ApiKeys

    path = serve.write_key_file(["a", "b"])
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        keys = ApiKeys.load(path, environ={})
        assert keys.check("Bearer b") == "b"
    finally:
        os.unlink(path)


def test_the_defaults_serve_states_are_the_verifiers():
    d = VerifierConfig()
    assert serve.VERIFIER_DEFAULTS == {k: getattr(d, k) for k in serve.VERIFIER_DEFAULTS}


def documented_serve_commands() -> list[list[str]]:
    """Every `splitspec serve ...` command in the README's and docs/vllm-flags.md's shell
    blocks, its arguments after `serve`."""
    commands = []
    for doc in ("README.md", "docs/vllm-flags.md"):
        for block in re.findall(r"```bash\n(.*?)```", (ROOT / doc).read_text(), re.S):
            for command in block.replace("\\\n", " ").splitlines():
                head = command.split()[:2]
                if len(head) == 2 and head[0].endswith("splitspec") and head[1] == "serve":
                    commands.append(shlex.split(command)[2:])
    return commands


def test_the_documented_serve_commands_start_the_stack_they_say():
    commands = documented_serve_commands()
    assert len(commands) >= 3
    for argv in commands:
        config = served(*argv)
        spec = build_parser().parse_args(["serve", *argv]).speculative_config
        assert set(config.launched()) == {m for m in spec.methods if m != "lookahead"}, argv
