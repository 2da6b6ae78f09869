"""Triton RMS norm: one program per row, the Llama definition of kernels/rms_norm.py in one
launch (float32 statistics, the normalised row rounded to the input dtype, then scaled by the
weight with one more rounding, as a bf16/fp16 multiply does). Tested on the CPU through Triton's
interpreter against the reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["rms_norm_triton"]


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_o, H, eps,
                     BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    mask = h < H
    x = tl.load(x_ptr + row * stride_x + h, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / H
    y = (x * (1.0 / tl.sqrt(var + eps))).to(out_ptr.dtype.element_ty)  # rounded, as x.to(dtype)
    w = tl.load(w_ptr + h, mask=mask, other=0.0)
    out = (w.to(tl.float32) * y.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + h, out, mask=mask)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, out, x2.stride(0), out.stride(0),
                                         shape[-1], float(eps),
                                         BLOCK_H=triton.next_power_of_2(shape[-1]))
    return out.view(shape)
