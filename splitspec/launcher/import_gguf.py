"""`splitspec import-gguf FILE.gguf DIR`: a GGUF file turned into a local model directory
(splitspec/gguf_import.py does the work)."""

from __future__ import annotations

import argparse
import sys

from splitspec import gguf_import


def add_command(commands) -> None:
    parser = commands.add_parser("import-gguf", help="turn a GGUF file into a local model "
                                 "directory (safetensors, tokenizer, chat template)")
    gguf_import.add_arguments(parser)
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> None:
    sys.exit(gguf_import.run(args))
