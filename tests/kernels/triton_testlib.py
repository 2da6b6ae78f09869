"""Importing a Triton kernel module under Triton's interpreter, for the CPU tests that hold a
kernel against its PyTorch reference."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch


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


def kernel_module(monkeypatch, name: str):
    """(module, device) to hold a Triton kernel against its reference: compiled on the GPU when
    the suite runs with TRITON_INTERPRET=0 on a CUDA machine (`TRITON_INTERPRET=0 pytest
    tests/kernels`), else interpreted on the CPU as `interpreted_module`."""
    if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available():
        return importlib.import_module(name), torch.device("cuda")
    return interpreted_module(monkeypatch, name), torch.device("cpu")


def on(device, case: dict) -> dict:
    """A case's tensors moved to `device` (its other values as they are)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.items()}
