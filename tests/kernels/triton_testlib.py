"""Importing a Triton kernel module under Triton's interpreter, for the CPU tests that hold a
kernel against its PyTorch reference."""

from __future__ import annotations

import importlib
import sys

import pytest


def interpreted_module(monkeypatch, name: str):
    """`name` imported afresh with TRITON_INTERPRET=1 (Triton reads it when a kernel is
    defined); skips when triton was already imported without the interpreter (tests/conftest.py
    sets the variable before anything imports triton, so the suite runs them)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.max, InterpretedFunction):
        pytest.skip("triton was imported without TRITON_INTERPRET=1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)
