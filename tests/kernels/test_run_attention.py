"""Attention over runs of consecutive slots (kernels/run_attention.py) against the gather path
it replaces: the context gathered slot by slot into one tensor, one masked SDPA. Random runs and
lengths, grouped-query heads, chains (the cached columns left unmasked), sliding windows that hide
whole runs from some rows, a padding row that sees column 0 only, and logits large enough to
overflow exp without the max subtracted; and the runs a block table's columns occupy. Control:
the runs weighed apart (each normalised on its own, as split partials combined without their
softmax weights)."""

from __future__ import annotations

import numpy as np
import planted_bugs as bug
import pytest
import torch
import torch.nn.functional as F

from kernels.paged_attention import context_slots
from kernels.run_attention import attention_over_runs, slot_runs

BS = 4  # block size


def _runs(g: torch.Generator, n_runs: int, context: int, num_blocks: int):
    """n_runs runs of whole blocks (the last one partial) at random places, not touching."""
    blocks = -(-context // BS)
    cuts = sorted(torch.randperm(blocks - 1, generator=g)[:n_runs - 1].add(1).tolist())
    sizes = np.diff([0, *cuts, blocks]).tolist()
    firsts, at = [], 1
    for n in sizes:  # a gap of at least one block between runs, so none is adjacent
        at += int(torch.randint(1, 4, (1,), generator=g))
        firsts.append(at)
        at += n
    assert at < num_blocks
    table = [f + j for f, n in zip(firsts, sizes) for j in range(n)]
    runs = tuple((f * BS, n * BS) for f, n in zip(firsts, sizes))
    last_first, last_n = runs[-1]
    runs = runs[:-1] + ((last_first, last_n - (blocks * BS - context)),)
    return table, runs


def _mask(kind: str, q: int, context: int, window: int = 5) -> tuple[torch.Tensor | None, int]:
    """A step's mask [Q, context] and the columns every row sees (mask_from)."""
    start = context - q  # rows are the last q columns, fed after `start` cached ones
    col = torch.arange(context)
    row = start + torch.arange(q)[:, None]
    if kind == "none":
        return None, 0
    if kind == "chain":
        return col <= row, start
    if kind == "window":  # rows see only the last `window` columns up to themselves
        return (col <= row) & (col > row - window), 0
    if kind == "padding":  # the last row sees column 0 only, as a padding query does
        m = col <= row
        m[-1] = False
        m[-1, 0] = True
        return m, 0
    raise ValueError(kind)


def _gathered(q, k_cache, v_cache, table, context, scale, mask):
    """The reference: the context gathered through the table, one masked SDPA."""
    slots = context_slots(torch.tensor([table]), BS)[0, :context]
    k = k_cache.index_select(0, slots).transpose(0, 1)[None]  # [1, Hkv, ctx, D]
    v = v_cache.index_select(0, slots).transpose(0, 1)[None]
    m = None if mask is None else mask[None, None]
    out = F.scaled_dot_product_attention(q[None], k, v, attn_mask=m, scale=scale,
                                         enable_gqa=k.shape[1] != q.shape[0])
    return out[0]


def check_runs_match_the_gather(seed: int, n_runs: int, hq: int, hkv: int, q_rows: int,
                                kind: str, logit_scale: float = 1.0) -> None:
    g = torch.Generator().manual_seed(seed)
    d, num_blocks = 16, 64
    context = int(torch.randint(q_rows + 4 * BS * n_runs, 150, (1,), generator=g))
    table, runs = _runs(g, n_runs, context, num_blocks)
    assert sum(n for _, n in runs) == context
    k_cache = torch.randn(num_blocks * BS, hkv, d, generator=g)
    v_cache = torch.randn(num_blocks * BS, hkv, d, generator=g)
    q = torch.randn(hq, q_rows, d, generator=g) * logit_scale
    mask, mask_from = _mask(kind, q_rows, context)
    scale = d ** -0.5
    got = attention_over_runs(q, k_cache, v_cache, runs, scale, mask, mask_from)
    want = _gathered(q, k_cache, v_cache, table, context, scale, mask)
    assert got.shape == want.shape == (hq, q_rows, d)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_runs", [1, 2, 3, 5])
@pytest.mark.parametrize("hq, hkv", [(4, 4), (6, 2), (9, 3)], ids=["mha", "gqa3", "gqa-smol"])
@pytest.mark.parametrize("q_rows, kind", [(1, "none"), (1, "window"), (4, "chain"),
                                          (7, "window"), (5, "padding")])
def test_runs_match_the_gathered_context(n_runs, hq, hkv, q_rows, kind):
    check_runs_match_the_gather(n_runs * 100 + hq * 10 + q_rows, n_runs, hq, hkv, q_rows, kind)


@pytest.mark.parametrize("q_rows, kind", [(1, "none"), (4, "chain")])
def test_large_logits_do_not_overflow(q_rows, kind):
    # scores in the hundreds: exp overflows float32 unless the row's max is subtracted
    check_runs_match_the_gather(7, 3, 6, 2, q_rows, kind, logit_scale=60.0)


@pytest.mark.parametrize("q_dtype, cache_dtype, tol", [
    (torch.bfloat16, torch.bfloat16, 2e-2), (torch.float32, torch.float16, 1e-5),
    (torch.float64, torch.float32, 1e-10)], ids=["bf16", "fp16-cache", "fp64-query"])
def test_other_dtypes_match_the_gather_in_the_querys_dtype(q_dtype, cache_dtype, tol):
    g = torch.Generator().manual_seed(3)
    table, runs = _runs(g, 3, 90, 64)
    k_cache = torch.randn(64 * BS, 2, 16, generator=g).to(cache_dtype)
    v_cache = torch.randn(64 * BS, 2, 16, generator=g).to(cache_dtype)
    q = torch.randn(6, 4, 16, generator=g).to(q_dtype)
    mask, mask_from = _mask("chain", 4, 90)
    got = attention_over_runs(q, k_cache, v_cache, runs, 0.25, mask, mask_from)
    want = _gathered(q, k_cache.to(q_dtype), v_cache.to(q_dtype), table, 90, 0.25, mask)
    assert got.dtype == q_dtype
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("seed", range(6))
def test_slot_runs_cover_the_tables_columns_in_order(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 12, (1,), generator=g))
    # blocks drawn so that some neighbours are consecutive and some are not
    table = (torch.randint(0, 3, (n,), generator=g) == 0).long().mul(5).add(1).cumsum(0)
    table = table.tolist()
    for context in range(1, n * BS + 1):
        runs = slot_runs(np.array(table + [999]), context, BS)  # a spare block past the context
        want = context_slots(torch.tensor([table]), BS)[0, :context].tolist()
        got = [s for first, cols in runs for s in range(first, first + cols)]
        assert got == want
        # maximal: a run never continues the one before it
        assert all(a + m != b for (a, m), (b, _) in zip(runs, runs[1:]))


def test_slot_runs_of_an_empty_context():
    assert slot_runs(np.array([3, 4]), 0, BS) == ()


@pytest.mark.parametrize("q_rows, kind", [(1, "none"), (4, "chain")])
def test_the_check_fails_when_runs_are_weighed_apart(monkeypatch, q_rows, kind):
    check_runs_match_the_gather(11, 3, 6, 2, q_rows, kind)
    bug.runs_weighed_apart(monkeypatch)
    with pytest.raises(AssertionError):
        check_runs_match_the_gather(11, 3, 6, 2, q_rows, kind)
