"""The int8-dot product (--quantization int8): per-column int8 weights whose product is the
dequantized weight's, within the rounding bound of per-column quantization of the float weight,
each row's bits the same alone, among 2-13 rows, at every thread count and vector width."""

from __future__ import annotations

import pytest
import torch
from test_linear import THREADS, check_rows_independent_of_their_call, torch_threads

from kernels import int8_dot
from kernels.linear import PackedLinear, available, batch_invariant, resolve

pytestmark = pytest.mark.skipif(not available("int8-dot"), reason="no int8-dot kernel here")


def _weight(out: int, inner: int, seed: int = 0) -> torch.Tensor:
    """Columns whose magnitudes span two decades (one scale for all would not fit them)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out, inner, generator=g) * torch.logspace(-2, 0, out)[:, None]


def check_within_the_per_column_bound(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> None:
    """Each output of the quantized product within half a step of its column's scale per input
    (|round(w / s) * s - w| <= s / 2) of the float product."""
    scale = w.abs().amax(dim=1) / 127
    bound = 0.5 * x.abs().double().sum(dim=1, keepdim=True) * scale.double()[None, :]
    err = (y.double() - x.double() @ w.double().T).abs()
    assert bool((err <= bound * 1.001 + 1e-6).all()), float((err - bound).max())


@pytest.mark.parametrize("shape", [(1376, 512), (961, 577), (33, 7), (5, 1)])
def test_int8_dot_is_the_dequantized_product_with_the_same_bits_everywhere(shape):
    """Odd shapes, a bias and rows with a stride: the dequantized weight's product to float
    precision, and the same bits at every thread count and with AVX2's code."""
    out, inner = shape
    w, b = _weight(out, inner), torch.randn(out)
    x = torch.randn(13, 2 * inner)[:, ::2]
    q, scale = int8_dot.quantize(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127 and scale.shape == (out,)
    packed = int8_dot.pack(q)
    for rows in (1, 4, 13):  # AVX-512 takes up to 7 rows two panels at a time
        results = []
        for threads in THREADS:
            with torch_threads(threads):
                results.append(int8_dot.product(x[:rows], packed, scale, b))
        results.append(int8_dot.product(x[:rows], packed, scale, b, avx2=True))
        assert all(torch.equal(r, results[0]) for r in results[1:]), rows
        want = x[:rows].double() @ int8_dot.dequantize(q, scale).double().T + b.double()
        torch.testing.assert_close(results[0], want.float(), rtol=1e-5, atol=1e-4)


def test_int8_dot_stays_within_per_column_quantization_of_the_float_product():
    w = _weight(300, 640, seed=1)
    x = torch.randn(6, 640)
    check_within_the_per_column_bound(x, w, PackedLinear(w, None, "int8-dot")(x))


@pytest.mark.parametrize("threads", THREADS)
def test_int8_dot_gives_a_row_the_same_bits_whatever_shares_its_call(threads):
    assert batch_invariant("int8-dot")
    check_rows_independent_of_their_call("int8-dot", threads)


def test_auto_never_quantizes():
    w = _weight(64, 32)  # not fp16 values: auto's fallbacks, never int8
    assert resolve("auto", [w]) != "int8-dot"
    assert resolve("int8-dot", [w]) == "int8-dot"
    with pytest.raises(ValueError, match="float32 weights on a CPU"):
        resolve("int8-dot", [w.to(torch.bfloat16)])
