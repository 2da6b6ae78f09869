"""The int8-dot product (kernels/csrc/int8_dot.cpp): fp32 rows times weights stored as int8 with
one fp32 scale per output column, each output one dot product computed the same way whatever
shares the call, columns split over torch's threads.

`--quantization int8`'s product (kernels/linear.py's "int8-dot"): weight-only, symmetric,
per-channel quantization (`quantize`: scale = max |w| / 127 over a column's inputs, q = round(w /
scale)), computed as sum_k x[k] * float(q[n, k]) in order, then times scale[n]. It reads half the
bytes of fp16-dot, the same thread split and row tiles, and the same batch invariance: a row's
result is bit-identical alone, among any number of rows and at any thread count.

torch's own int8 weight-only product (torch._weight_int8pack_mm) was measured first on the 2-core
development machine (torch 2.13, fp32 rows): batch invariant, but 2.8 ms for one row of a 3072 x
576 weight on one thread (0.6 GB/s of weights) and slower on two; bf16 rows 0.27 ms on one thread
and slower on two. fp16-dot reads that weight in about 0.1 ms (bench/reports/quantization.md).

Compiled on first use like fp16-dot (kernels/cpp_build.py); where it cannot run, `library()` is
None and `why_unavailable()` says why.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from kernels import cpp_build

log = logging.getLogger(__name__)

_reason: list[str] = []  # why the library did not load, once tried


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """The compiled product, built on first use; None where it cannot run on this machine."""
    lib, reason = cpp_build.load("int8_dot")
    if lib is None:
        return _unavailable(reason)
    for name in ("splitspec_int8_dot", "splitspec_int8_dot_avx2"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_int64]
    if lib.splitspec_int8_dot_isa() == 0:
        return _unavailable("the CPU has neither AVX-512 nor AVX2 with FMA")
    return lib


def _unavailable(reason: str) -> None:
    _reason.append(reason)
    log.info("int8-dot linear kernel unavailable: %s", reason)
    return None


def why_unavailable() -> str | None:
    """Why library() is None (None when it loads)."""
    return None if library() is not None else _reason[-1]


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight [N, K] as int8 values [N, K] and one float32 scale per output column [N]:
    symmetric, scale = max |w[n]| / 127 (1 for an all-zero column), q = round(w / scale) in
    [-127, 127]."""
    w = weight.detach().to(torch.float32)
    peak = w.abs().amax(dim=1)
    scale = torch.where(peak > 0, peak / 127, torch.ones_like(peak))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale.contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 weight the int8 product computes with: q * scale per column."""
    return q.to(torch.float32) * scale[:, None]


def pack(q: torch.Tensor) -> torch.Tensor:
    """int8 weights [N, K] in the product's layout: panels of the library's panel width of
    columns, each [K, panel] row-major, zero-padded."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"int8-dot kernel unavailable: {why_unavailable()}")
    panel = lib.splitspec_int8_dot_panel()
    n, k = q.shape
    padded = q.new_zeros(-(-n // panel) * panel, k, dtype=torch.int8)
    padded[:n] = q
    return padded.view(-1, panel, k).transpose(1, 2).contiguous()


def product(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
            bias: torch.Tensor | None = None, avx2: bool = False) -> torch.Tensor:
    """x [M, K] float32 @ (q * scale).T (+ bias), q as pack() left it, scale [N] float32:
    [M, N] float32. avx2: run the AVX2 code on one thread even where AVX-512 runs."""
    if x.dtype != torch.float32 or packed.dtype != torch.int8 or scale.dtype != torch.float32:
        raise TypeError("int8-dot multiplies float32 rows by int8 weights pack() made and "
                        "float32 scales")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    m, k = x.shape
    n = scale.shape[0]
    panels, inner, width = packed.shape if packed.dim() == 3 else (0, -1, 0)
    if inner != k or panels * width < n or not scale.is_contiguous():
        raise ValueError(f"int8-dot weights {tuple(packed.shape)} do not take rows of {k} "
                         f"to {n} outputs")
    y = torch.empty(m, n, dtype=torch.float32)
    if m:
        lib = library()
        fn = lib.splitspec_int8_dot_avx2 if avx2 else lib.splitspec_int8_dot
        fn(x.data_ptr(), m, k, x.stride(0), packed.data_ptr(), scale.data_ptr(), n,
           None if bias is None else bias.data_ptr(), y.data_ptr(), n)
    return y
