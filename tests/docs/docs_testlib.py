"""Helpers for the documentation tests: the reference generator (scripts/gen_reference.py)
loaded as a module, and the Markdown pages a user reads."""

from __future__ import annotations

import importlib.util
import sys
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
