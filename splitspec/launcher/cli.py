"""The `splitspec` command (also `python -m splitspec.launcher`): the local launcher's
subcommands, each in its own module with an `add_command(subparsers)` that registers its flags
and the function that runs it.

    splitspec serve MODEL ...  the whole stack under vLLM's flag names (splitspec/launcher/serve.py)
    splitspec up ...           the same stack, every switch spelled out (splitspec/launcher/up.py)
    splitspec import-gguf ...  turn a GGUF file into a local model directory
                               (splitspec/launcher/import_gguf.py)
"""

from __future__ import annotations

import argparse
from typing import Sequence

from splitspec.launcher import import_gguf, serve, up

DESCRIPTION = """\
Speculative decoding served as separate processes: a gateway (OpenAI-compatible REST and gRPC),
a verifier that owns the target model, and proposers that guess its tokens.

    splitspec serve MODEL [--speculative-config JSON] ...   as `vllm serve` takes it
    splitspec up [--model DIR] ...                         every switch spelled out
    splitspec import-gguf FILE.gguf DIR                    a GGUF file as a model directory

`splitspec COMMAND --help` lists a command's flags and their defaults.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="splitspec", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.add_command(commands)
    up.add_command(commands)
    import_gguf.add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.run(args)
