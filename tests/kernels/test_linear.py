"""Packed linear kernels: the same products as F.linear, row for row independent of the batch
at every thread count, and fp16 packing only where it is exact."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

from kernels import fp16_dot
from kernels.linear import (
    PackedLinear,
    available,
    batch_invariant,
    fp16_exact,
    pack_linears,
    resolve,
)

PACKED = [b for b in ("onednn", "fp16", "fp16-dot") if available(b)]
THREADS = sorted({1, 2, torch.get_num_threads()})  # 1, this machine's default, and 2


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


@contextlib.contextmanager
def torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_rows_independent_of_their_call(backend: str, threads: int) -> None:
    """What makes a verified token see the numbers of a plain decode: row i of a product of 2 to
    13 rows (a decode row among a verification's k + 1) equals the 1-row product of that row,
    bit for bit, at this thread count, for the target's shapes (a short and a long reduction, a
    column count that is no multiple of any tile)."""
    g = torch.Generator().manual_seed(3)
    with torch_threads(threads):
        for out, inner in ((1376, 512), (200, 1536)):
            lin = PackedLinear(_fp16_valued(out, inner, seed=out), None, backend)
            x = torch.randn(20, inner, generator=g)
            alone = torch.cat([lin(x[i:i + 1]) for i in range(x.shape[0])])
            for rows in range(2, 14):
                for start in (0, 7):
                    got = lin(x[start:start + rows])
                    assert torch.equal(got, alone[start:start + rows]), (backend, rows, start)


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("backend", INVARIANT)
def test_a_row_gets_the_same_bits_whatever_shares_its_call(backend, threads):
    """Every kernel the probe admits, at every thread count the step may be given."""
    check_rows_independent_of_their_call(backend, threads)
    w = _fp16_valued(1376, 512)
    x = torch.randn(64, 512)
    with torch_threads(threads):
        lin = PackedLinear(w, None, backend)
        alone = torch.cat([lin(x[i:i + 1]) for i in range(x.shape[0])])
        assert torch.equal(lin(x), alone)  # a prefill's worth of rows too


@pytest.mark.parametrize("backend", [b for b in PACKED if b not in INVARIANT])
def test_a_kernel_the_probe_turns_down_does_change_a_row_with_its_batch(backend):
    """The probe's no is the check's no (oneDNN on the AVX-512 development machine: a 1-row call
    over 1536 inputs takes other code), so auto never loses an invariant kernel to the probe."""
    with pytest.raises(AssertionError):
        check_rows_independent_of_their_call(backend, 1)


@pytest.mark.skipif(not available("fp16-dot"), reason="no fp16-dot kernel on this CPU")
@pytest.mark.parametrize("shape", [(1376, 512), (961, 577), (33, 7), (5, 1)])
def test_fp16_dot_gives_a_row_the_same_bits_at_every_thread_count_and_vector_width(shape):
    """fp16-dot's outputs are each one sequential sum, so neither the threads that split the
    columns nor AVX-512 against AVX2 change a bit (bias, odd shapes, rows with a stride)."""
    out, inner = shape
    w, b = _fp16_valued(out, inner), torch.randn(out)
    x = torch.randn(13, 2 * inner)[:, ::2]  # rows with a stride
    packed = fp16_dot.pack(w)
    for rows in (1, 4, 13):  # AVX-512 takes up to 7 rows two panels at a time
        results = []
        for threads in THREADS:
            with torch_threads(threads):
                results.append(fp16_dot.product(x[:rows], packed, out, b))
        results.append(fp16_dot.product(x[:rows], packed, out, b, avx2=True))
        assert all(torch.equal(r, results[0]) for r in results[1:]), rows
        want = (x[:rows].double() @ w.double().T + b.double()).float()
        torch.testing.assert_close(results[0], want, rtol=1e-5, atol=1e-4)


def test_fp16_dot_says_why_it_is_missing_and_builds_into_its_cache(monkeypatch, tmp_path):
    """No compiler and nothing built before: no library, and the reason named; with one, the
    library is built into $SPLITSPEC_KERNEL_CACHE under a name keyed by its source, flags and
    torch, and found there again without a compiler (a prebuilt image's case)."""
    monkeypatch.setenv("SPLITSPEC_KERNEL_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(fp16_dot, "_compiler", lambda: None)
    fp16_dot.library.cache_clear()
    try:
        assert fp16_dot.library() is None
        assert "compiler" in fp16_dot.why_unavailable()
        monkeypatch.undo()
        if fp16_dot._compiler() is None or fp16_dot.isa() == 0:
            return
        monkeypatch.setenv("SPLITSPEC_KERNEL_CACHE", str(tmp_path))
        fp16_dot.library.cache_clear()
        assert fp16_dot.library() is not None and fp16_dot.why_unavailable() is None
        assert [p.name.startswith("fp16_dot-") for p in tmp_path.iterdir()] == [True]
        monkeypatch.setattr(fp16_dot, "_compiler", lambda: None)
        fp16_dot.library.cache_clear()
        assert fp16_dot.library() is not None
    finally:
        monkeypatch.undo()
        fp16_dot.library.cache_clear()


def test_auto_skips_fp16_dot_where_it_cannot_be_built(monkeypatch):
    """No compiler (or no AVX2): the library is None, fp16-dot is unavailable and the target's
    auto falls back to FBGEMM's fp16 for fp16-exact weights."""
    import kernels.linear as lin

    monkeypatch.setattr(fp16_dot, "library", lambda: None)
    for cached in (lin.available, lin.batch_invariant):
        cached.cache_clear()
    try:
        assert not available("fp16-dot")
        want = "fp16" if batch_invariant("fp16") else "onednn"
        assert resolve("auto", [_fp16_valued(8, 8)]) in (want, "dense")
        with pytest.raises(ValueError, match="fp16-dot"):
            resolve("fp16-dot", [_fp16_valued(8, 8)])
    finally:
        monkeypatch.undo()
        for cached in (lin.available, lin.batch_invariant):
            cached.cache_clear()


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
        for cached in (lin.fp16_row_block, lin.available, lin.batch_invariant):
            cached.cache_clear()  # verdicts reached under the plant would outlive it


def test_auto_packs_fp16_only_when_every_weight_is_an_fp16_value():
    exact = [_fp16_valued(8, 8), _fp16_valued(16, 8, seed=2)]
    inexact = exact + [torch.randn(8, 8)]
    assert all(fp16_exact(w) for w in exact) and not fp16_exact(inexact[-1])
    if batch_invariant("fp16-dot"):  # the kernel that splits every product over the threads
        assert resolve("auto", exact) == "fp16-dot"
    elif batch_invariant("fp16"):
        assert resolve("auto", exact) == "fp16"
    if batch_invariant("onednn"):
        assert resolve("auto", inexact) == "onednn"
    for backend in ("fp16", "fp16-dot"):
        with pytest.raises(ValueError, match="exactly fp16"):
            PackedLinear(inexact[-1], None, backend)


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
        assert not any(batch_invariant(b) for b in ("onednn", "fp16", "fp16-dot"))
        assert resolve("auto", exact) == "dense"
    finally:
        monkeypatch.undo()
        available.cache_clear()  # verdicts reached under the plant would outlive it
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
