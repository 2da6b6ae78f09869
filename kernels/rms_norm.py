"""RMS normalisation as the Llama family defines it: in float32, the normalised row rounded to
the input's dtype, then scaled by the weight in that dtype,

    y = weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype)

In float32 that is one fused op (torch.rms_norm). In bf16/fp16 it is eight eager kernels per
call (two per decoder layer): on CUDA / MLU with Triton, kernels/triton_rms_norm.py computes it
in one launch (the same roundings; the reduction order may differ in the last bit), elsewhere
the plain ops below run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["rms_norm", "rms_norm_reference"]


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:  # one fused op (the step is mostly per-op overhead)
        return F.rms_norm(x, weight.shape, weight, eps)
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, impl: str = "auto"
             ) -> torch.Tensor:
    """x [..., H], weight [H] -> [..., H]; impl: "auto" (Triton for low precision on CUDA /
    MLU when available) | "reference" | "triton"."""
    if x.dtype != torch.float32 and impl != "reference":
        from kernels.rejection import _use_triton

        if _use_triton(x.device, impl):
            from kernels.triton_rms_norm import rms_norm_triton

            return rms_norm_triton(x, weight, eps)
    return rms_norm_reference(x, weight, eps)
