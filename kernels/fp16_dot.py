"""The fp16-dot product (kernels/csrc/fp16_dot.cpp): fp32 rows times weights stored as fp16, each
output one dot product computed the same way whatever shares the call, columns split over torch's
threads.

FBGEMM's fp16 GEMM, the library path, splits a call over threads by rows: a decode row runs on
one core however many it is given, and its micro-kernel's rows cost almost linearly up to its
height. This product splits by output columns instead, so a single row reads the weights with
every thread, and it keeps a tile of rows in registers against each weight chunk, so a few rows
cost little more than one. A row's result is bit-identical alone, among any number of rows and
at any thread count (the C++ file says why).

The library is compiled on first use (kernels/cpp_build.py: the C++ compiler found at run time,
cached by a hash of the source, the flags, torch and the compiler). Where there is no compiler,
no x86 CPU with AVX2 + FMA + F16C, or the build fails, `library()` is None, `why_unavailable()`
says why, and kernels/linear.py's auto never picks it.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from kernels import cpp_build

log = logging.getLogger(__name__)

_reason: list[str] = []  # why the library did not load, once tried


def _compiler() -> str | None:
    return cpp_build.compiler()


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """The compiled product, built on first use (kernels/cpp_build.py); None where it cannot
    run on this machine."""
    lib, reason = cpp_build.load("fp16_dot", find_compiler=lambda: _compiler())
    if lib is None:
        return _unavailable(reason)
    for name in ("splitspec_fp16_dot", "splitspec_fp16_dot_avx2"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_int64]
    if lib.splitspec_fp16_dot_isa() == 0:
        return _unavailable("the CPU has neither AVX-512 nor AVX2 with FMA and F16C")
    return lib


def _unavailable(reason: str) -> None:
    _reason.append(reason)
    log.info("fp16-dot linear kernel unavailable: %s", reason)
    return None


def why_unavailable() -> str | None:
    """Why library() is None (None when it loads)."""
    return None if library() is not None else _reason[-1]


def isa() -> int:
    """The vector width the product runs with here: 512 (AVX-512), 256 (AVX2), 0 (no library)."""
    lib = library()
    return lib.splitspec_fp16_dot_isa() if lib is not None else 0


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A weight [N, K] whose values are fp16 values, in the product's layout: panels of the
    library's panel width of columns, each [K, panel] row-major, zero-padded; int16."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"fp16-dot kernel unavailable: {why_unavailable()}")
    panel = lib.splitspec_fp16_dot_panel()
    n, k = weight.shape
    padded = weight.new_zeros(-(-n // panel) * panel, k, dtype=torch.float16)
    padded[:n] = weight
    return padded.view(-1, panel, k).transpose(1, 2).contiguous().view(torch.int16)


def product(x: torch.Tensor, packed: torch.Tensor, out_features: int,
            bias: torch.Tensor | None = None, avx2: bool = False) -> torch.Tensor:
    """x [M, K] float32 @ weight.T (+ bias) with the weight as pack() left it: [M, N] float32.
    avx2: run the AVX2 code on one thread even where AVX-512 runs (the test that both give the
    same bits)."""
    if x.dtype != torch.float32 or packed.dtype != torch.int16:
        raise TypeError("fp16-dot multiplies float32 rows by weights pack() made")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    m, k = x.shape
    panels, inner, width = packed.shape if packed.dim() == 3 else (0, -1, 0)
    if inner != k or panels * width < out_features:
        raise ValueError(f"fp16-dot weights {tuple(packed.shape)} do not take rows of {k} "
                         f"to {out_features} outputs")
    y = torch.empty(m, out_features, dtype=torch.float32)
    if m:
        lib = library()
        fn = lib.splitspec_fp16_dot_avx2 if avx2 else lib.splitspec_fp16_dot
        fn(x.data_ptr(), m, k, x.stride(0), packed.data_ptr(), out_features,
           None if bias is None else bias.data_ptr(), y.data_ptr(), out_features)
    return y
