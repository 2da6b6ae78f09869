"""The fused RMS norm (Triton's interpreter on the CPU) against the Llama definition."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kernels.rms_norm import rms_norm, rms_norm_reference


def test_float32_is_torch_rms_norm():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 5, 40, generator=g), torch.randn(40, generator=g)
    ref = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(rms_norm(x, w, 1e-6), ref)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hidden", [64, 100])
def test_triton_equals_reference(monkeypatch, dtype, hidden):
    from triton_testlib import kernel_module

    mod, device = kernel_module(monkeypatch, "kernels.triton_rms_norm")
    g = torch.Generator().manual_seed(hidden)
    x = (torch.randn(2, 7, hidden, generator=g) * 3).to(dtype)
    w = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    got = mod.rms_norm_triton(x.to(device), w.to(device), 1e-5).cpu()
    ref = rms_norm_reference(x, w, 1e-5)
    assert got.dtype == dtype and got.shape == x.shape
    # The same two roundings; the float32 sum's order may move the last bit of a few values.
    # Triton's interpreter rounds float32 -> bfloat16 by truncation (GPUs round to nearest):
    # there a value may be up to two bf16 units off, one per rounding.
    ulp = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    close = torch.isclose(got.float(), ref.float(), rtol=2 * ulp, atol=0)
    assert close.all()
    if dtype == torch.float16:
        assert (got == ref).float().mean() > 0.95
