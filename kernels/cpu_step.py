"""A CPU decoder layer's work around its products in a few calls (kernels/csrc/cpu_step.cpp):
residual add with RMS norm, SiLU-gated product, RoPE with the cache write, and attention of a
few rows per sequence over the paged cache read in place.

At one to a few rows, a layer's torch operators between the products (norms, RoPE, views,
attention, the cache write) cost their fixed overhead each, a few microseconds, dozens of times
per layer. These functions do the same arithmetic in one call each, every row by the same
sequence of operations whatever shares the call (rows are split over torch's threads, never a
row's sums), so a verified row keeps a decode row's numbers. The RMS norm's sum, the SiLU's and
the softmax's exponential are not torch's (a vectorized polynomial exp, ~2e-7 relative), so
their bits differ from the torch operators' in the last places; RoPE's are the same.

`library()` is None (and `available()` False) where the library cannot be built or loaded
(kernels/cpp_build.py); callers then run the torch operators.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from kernels import cpp_build

__all__ = ["add_rms", "attend", "available", "library", "rope_write", "silu_mul"]

log = logging.getLogger(__name__)
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    "splitspec_add_rms": [_P, _P, _P, _F, _I, _I, _P, _P],
    "splitspec_silu_mul": [_P, _I, _I, _P],
    "splitspec_rope_write": [_P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _P],
    "splitspec_attend": [_P, _I, _I, _I, _F, _P, _P, _P, _I, _P, _P, _I, _P],
}


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    lib, reason = cpp_build.load("cpu_step")
    if lib is None:
        log.info("CPU step kernels unavailable (torch operators run): %s", reason)
        return None
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = None, args
    return lib


def available(x: torch.Tensor) -> bool:
    """Whether rows like x (float32 on the CPU) run through these kernels here."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and library() is not None


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def add_rms(x: torch.Tensor, r: torch.Tensor | None, weight: torch.Tensor, eps: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """x, r [T, H] float32: (x + r, rms_norm(x + r) * weight); with r None, (x, rms_norm(x) *
    weight). New tensors: x is not written."""
    x = x.contiguous()
    t, h = x.shape
    out_h = torch.empty_like(x)
    out_x = x
    if r is not None:
        r = r.contiguous()
        out_x = torch.empty_like(x)
    library().splitspec_add_rms(x.data_ptr(), _ptr(r), weight.contiguous().data_ptr(), eps, t,
                                h, None if r is None else out_x.data_ptr(), out_h.data_ptr())
    return out_x, out_h


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] (gate | up) -> silu(gate) * up [T, I]."""
    gate_up = gate_up.contiguous()
    t, width = gate_up.shape
    out = gate_up.new_empty(t, width // 2)
    library().splitspec_silu_mul(gate_up.data_ptr(), t, width // 2, out.data_ptr())
    return out


def rope_write(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, n_heads: int,
               n_kv: int) -> torch.Tensor:
    """qkv [T, >= (Hq + 2 Hkv) D] (one product's queries, keys, values), positions, slots [T]
    int64, cos/sin [P, D] (sin signed: see lean_llama._rope_for), a layer's caches [slots, Hkv,
    D]: writes each row's rotated key and its value into its slot; returns the rotated queries
    [T, Hq, D]."""
    t, d = qkv.shape[0], cos.shape[-1]
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    q = qkv.new_empty(t, n_heads, d)
    library().splitspec_rope_write(qkv.data_ptr(), t, qkv.stride(0), n_heads, n_kv, d,
                                   positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                   slots.data_ptr(), q.data_ptr(), k_cache.data_ptr(),
                                   v_cache.data_ptr())
    return q


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float,
           seqs: torch.Tensor, runs: torch.Tensor, ancestors: torch.Tensor, max_ctx: int,
           out: torch.Tensor) -> torch.Tensor:
    """q [T, Hq, D]; a layer's caches [slots, Hkv, D]; seqs [S, 6] int64 (first row, rows,
    cached columns, first run, runs, ancestors offset or -1 for a chain); runs [*, 2] int64
    (first slot, columns); ancestors uint8, each tree's [rows, rows] relation flat; max_ctx the
    longest listed context. Writes the listed sequences' rows of out [T, Hq * D]."""
    hq, d = q.shape[1], q.shape[2]
    library().splitspec_attend(q.data_ptr(), hq, k_cache.shape[1], d, scale, k_cache.data_ptr(),
                               v_cache.data_ptr(), seqs.data_ptr(), seqs.shape[0],
                               runs.data_ptr(), ancestors.data_ptr(), max_ctx, out.data_ptr())
    return out
