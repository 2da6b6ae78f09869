"""Packed linear kernels: the same products as F.linear, row for row independent of the batch,
and fp16 packing only where it is exact."""

import pytest
import torch
import torch.nn.functional as F

from kernels.linear import (
    PackedLinear,
    available,
    batch_invariant,
    fp16_exact,
    pack_linears,
    resolve,
)

PACKED = [b for b in ("onednn", "fp16") if available(b)]


def _fp16_valued(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).half().float()


@pytest.mark.parametrize("backend", ["dense", *PACKED])
@pytest.mark.parametrize("rows", [1, 2, 6, 9, 150])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("invariant", [True, False])  # the target's products, a drafter's
def test_packed_linear_computes_the_dense_product(backend, rows, bias, invariant):
    w = _fp16_valued(96, 64)
    b = _fp16_valued(96, seed=1) if bias else None
    x = torch.randn(rows, 64)
    got = PackedLinear(w, b, backend, invariant)(x)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", PACKED)
def test_packed_linear_keeps_leading_dims(backend):
    w = _fp16_valued(32, 16)
    x = torch.randn(2, 3, 16)
    out = PackedLinear(w, None, backend)(x)
    assert out.shape == (2, 3, 32)
    torch.testing.assert_close(out, F.linear(x, w), rtol=1e-5, atol=1e-5)


# The kernels auto may choose on this CPU: the probe's verdict, held against a model-sized weight.
INVARIANT = [b for b in PACKED if batch_invariant(b)]


@pytest.mark.parametrize("backend", INVARIANT)
def test_a_row_gets_the_same_bits_whatever_shares_its_call(backend):
    """What makes a verified token see the numbers of a plain decode: row i of a k+1-row product
    equals the 1-row product of that row, bit for bit (for every kernel the probe admits)."""
    w = _fp16_valued(1376, 512)
    x = torch.randn(64, 512)
    lin = PackedLinear(w, None, backend)
    alone = torch.cat([lin(x[i:i + 1]) for i in range(x.shape[0])])
    for rows in (2, 6, 8, 64):
        assert torch.equal(lin(x[:rows]), alone[:rows]), rows


def test_fp16_row_block_is_refused_when_no_padding_makes_rows_independent(monkeypatch):
    """The probe behind the fp16 kernel's invariance: a kernel whose rows see how many rows
    share the call, however padded, gets no block (and auto then never picks fp16)."""
    import kernels.linear as lin

    real = lin._fp16_rows

    def batch_dependent(packed, x, block):
        return real(packed, x, block) + 1e-3 * (x.shape[0] > 1)

    monkeypatch.setattr(lin, "_fp16_rows", batch_dependent)
    lin.fp16_row_block.cache_clear()
    lin.batch_invariant.cache_clear()
    try:
        assert lin.fp16_row_block() is None
        assert not lin.batch_invariant("fp16")
    finally:
        monkeypatch.undo()
        lin.fp16_row_block.cache_clear()
        lin.batch_invariant.cache_clear()


def test_auto_packs_fp16_only_when_every_weight_is_an_fp16_value():
    exact = [_fp16_valued(8, 8), _fp16_valued(16, 8, seed=2)]
    inexact = exact + [torch.randn(8, 8)]
    assert all(fp16_exact(w) for w in exact) and not fp16_exact(inexact[-1])
    if batch_invariant("fp16"):
        assert resolve("auto", exact) == "fp16"
    if batch_invariant("onednn"):
        assert resolve("auto", inexact) == "onednn"
    with pytest.raises(ValueError, match="exactly fp16"):
        PackedLinear(inexact[-1], None, "fp16")


def test_auto_for_drafters_reads_fp16_weights_as_fp16_even_when_not_batch_invariant(monkeypatch):
    """A drafter's rows need not be batch invariant: auto takes the fp16 kernel for fp16-exact
    weights wherever it runs, where the target's auto (invariant) would skip it."""
    exact, inexact = [_fp16_valued(8, 8)], [torch.randn(8, 8)]
    monkeypatch.setattr("kernels.linear.batch_invariant", lambda backend: False)
    assert resolve("auto", exact) == "dense"  # the target's rule
    if available("fp16"):
        assert resolve("auto", exact, invariant=False) == "fp16"
    if available("onednn"):
        assert resolve("auto", inexact, invariant=False) == "onednn"
    assert resolve("dense", exact, invariant=False) == "dense"


def test_auto_never_picks_a_kernel_that_changes_a_row_with_its_batch(monkeypatch):
    """The probe sees a kernel whose row depends on the rows beside it, and auto then skips it."""
    exact = [_fp16_valued(8, 8)]
    real_call = PackedLinear.__call__

    def batch_dependent(self, x):  # a kernel that adds the row count's bits to every row
        y = real_call(self, x)
        return y + 1e-3 * (x.reshape(-1, x.shape[-1]).shape[0] > 1)

    monkeypatch.setattr(PackedLinear, "__call__", batch_dependent)
    batch_invariant.cache_clear()
    try:
        assert not batch_invariant("onednn") and not batch_invariant("fp16")
        assert resolve("auto", exact) == "dense"
    finally:
        monkeypatch.undo()
        batch_invariant.cache_clear()


def test_auto_stays_dense_off_float32_and_names_bad_backends():
    assert resolve("auto", [torch.randn(4, 4, dtype=torch.float64)]) == "dense"
    assert resolve("dense", [torch.randn(4, 4)]) == "dense"
    with pytest.raises(ValueError, match="linear backend"):
        resolve("fast", [torch.randn(4, 4)])
    with pytest.raises(ValueError, match="float32"):
        resolve("onednn", [torch.randn(4, 4, dtype=torch.float64)])


@pytest.mark.skipif(not PACKED, reason="no packed backend on this CPU")
def test_pack_linears_swaps_every_linear_and_keeps_the_function():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                              torch.nn.ModuleList([torch.nn.Linear(32, 8, bias=False)]))
    x = torch.randn(5, 16)
    with torch.no_grad():
        want = net[2][0](net[1](net[0](x)))
    chosen = pack_linears(net, "onednn")
    assert chosen == "onednn"
    assert not any(isinstance(m, torch.nn.Linear) for m in net.modules())
    assert net[2][0].weight.shape == (8, 32) and net[0].bias is not None
    with torch.no_grad():
        got = net[2][0](net[1](net[0](x)))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
