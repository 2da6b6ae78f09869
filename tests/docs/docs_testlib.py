"""Helpers for the documentation tests: the reference generator (scripts/gen_reference.py)
loaded as a module, and the Markdown pages a user reads."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test",
                                                  REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GEN_REFERENCE = load_script("gen_reference")


def hand_written_pages() -> list[Path]:
    """The README and every page under docs/ but the generated reference."""
    return [REPO / "README.md", *sorted(p for p in DOCS.rglob("*.md")
                                        if "reference" not in p.relative_to(DOCS).parts)]


# -- code blocks -------------------------------------------------------------------------------

FENCE = re.compile(
    r"^(?P<indent> *)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*(?P<kind>skip|response):\s*(?P<text>.*?)\s*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    body: str
    skip: str | None = None  # the reason given in a `<!-- skip: REASON -->` before the block
    response: str | None = None  # `<!-- response: WHAT -->`: the block shows part of an answer

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def code_blocks(page: Path) -> list[Block]:
    """Every fenced block of a Markdown page, with the marker on the line before it, if any."""
    text = page.read_text()
    blocks = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        block = Block(page, line, m["lang"], m["body"])
        if marker is not None:
            setattr(block, marker["kind"], marker["text"])
        blocks.append(block)
    return blocks


def shell_commands(body: str) -> list[list[str]]:
    """The commands of a shell block, each split as the shell would (continuation lines and
    quoted newlines joined, comments dropped; environment assignments before the command
    kept)."""
    out, pending = [], ""
    for line in body.replace("\\\n", " ").splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on on the next line
            continue
        pending = ""
        if words:
            out.append(words)
    assert not pending, f"an unclosed quote in: {pending!r}"
    return out


def command_word(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """(the VAR=value assignments before a command, the command and its arguments)."""
    env = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        key, _, value = words[0].partition("=")
        env[key] = value
        words = words[1:]
    return env, words
