"""The `splitspec` command (also `python -m splitspec.launcher`): the local launcher's
subcommands, each in its own module with an `add_command(subparsers)` that registers its flags
and the function that runs it.

    splitspec up ...           serve the whole stack on this machine (splitspec/launcher/up.py)
    splitspec import-gguf ...  turn a GGUF file into a local model directory
                               (splitspec/launcher/import_gguf.py)
"""

from __future__ import annotations

import argparse
from typing import Sequence

from splitspec.launcher import import_gguf, up


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="splitspec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    up.add_command(commands)
    import_gguf.add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.run(args)
