"""The CPU step kernels (kernels/cpu_step.py) against torch's operators, and the invariance the
target needs: a row's bits alone, among other rows and sequences, at every thread count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import cpu_step
from verifier_service.kv.cpu_attention import CpuAttention

pytestmark = pytest.mark.skipif(cpu_step.library() is None, reason="no C++ kernels here")

HQ, HKV, D = 6, 2, 16


def test_add_rms_and_silu_mul_agree_with_torch():
    g = torch.Generator().manual_seed(0)
    x, r, w = torch.randn(5, 96, generator=g), torch.randn(5, 96, generator=g), torch.randn(96)
    new_x, h = cpu_step.add_rms(x, r, w, 1e-5)
    assert torch.equal(new_x, x + r)
    torch.testing.assert_close(h, F.rms_norm(x + r, (96,), w, 1e-5), rtol=1e-5, atol=1e-5)
    same, h0 = cpu_step.add_rms(x, None, w, 1e-5)
    assert same is x
    torch.testing.assert_close(h0, F.rms_norm(x, (96,), w, 1e-5), rtol=1e-5, atol=1e-5)
    gu = torch.randn(3, 200, generator=g) * 6
    torch.testing.assert_close(cpu_step.silu_mul(gu), F.silu(gu[:, :100]) * gu[:, 100:],
                               rtol=2e-6, atol=1e-6)


def test_rope_write_gives_the_torch_operators_bits_and_fills_the_slots():
    g = torch.Generator().manual_seed(1)
    t, positions, slots = 4, torch.tensor([7, 0, 31, 7]), torch.tensor([3, 9, 0, 12])
    qkv = torch.randn(t, (HQ + 2 * HKV) * D, generator=g)
    cos, sin = torch.randn(32, D, generator=g), torch.randn(32, D, generator=g)
    k_cache, v_cache = torch.zeros(16, HKV, D), torch.zeros(16, HKV, D)
    q = cpu_step.rope_write(qkv, positions, cos, sin, slots, k_cache, v_cache, HQ, HKV)
    qk = qkv[:, :(HQ + HKV) * D].view(t, HQ + HKV, D)
    c, s = cos[positions][:, None], sin[positions][:, None]
    rotated = qk * c + qk.roll(D // 2, -1) * s  # lean_llama's RoPE, bit for bit
    assert torch.equal(q, rotated[:, :HQ])
    assert torch.equal(k_cache[slots], rotated[:, HQ:])
    assert torch.equal(v_cache[slots], qkv[:, (HQ + HKV) * D:].view(t, HKV, D))


def _reference(q, k_cache, v_cache, slots, visible, scale):
    """q [n, Hq, D] over context slots [ctx] with visible [n, ctx]: [n, Hq * D]."""
    k = k_cache[slots].permute(1, 0, 2)[None]
    v = v_cache[slots].permute(1, 0, 2)[None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k, v, attn_mask=visible,
                                         scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(q.shape[0], -1)


def _case(g):
    """Two sequences over runs of a 64-slot cache: a chain of 3 rows after 21 cached columns in
    three runs, and a tree of 4 rows (root, two children, a grandchild) after 9 cached."""
    k_cache, v_cache = torch.randn(64, HKV, D, generator=g), torch.randn(64, HKV, D, generator=g)
    chain_slots = torch.cat([torch.arange(40, 48), torch.arange(8, 16), torch.arange(50, 58)])[:24]
    tree_slots = torch.cat([torch.arange(20, 30), torch.arange(0, 3)])
    anc = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.uint8)
    seqs = torch.tensor([[0, 3, 21, 0, 3, -1], [3, 4, 9, 3, 2, 0]])
    runs = torch.tensor([[40, 8], [8, 8], [50, 8], [20, 10], [0, 3]])
    q = torch.randn(7, HQ, D, generator=g)
    chain_seen = torch.cat([torch.ones(3, 21, dtype=torch.bool),
                            torch.ones(3, 3, dtype=torch.bool).tril()], 1)
    tree_seen = torch.cat([torch.ones(4, 9, dtype=torch.bool), anc.bool()], 1)
    return (k_cache, v_cache, q, seqs, runs, anc.flatten(),
            [(chain_slots, chain_seen, 0, 3), (tree_slots, tree_seen, 3, 4)])


def test_attention_over_runs_of_chains_and_trees_agrees_with_sdpa():
    k_cache, v_cache, q, seqs, runs, anc, refs = _case(torch.Generator().manual_seed(2))
    out = cpu_step.attend(q, k_cache, v_cache, 0.3, seqs, runs, anc, 24, torch.empty(7, HQ * D))
    for slots, seen, first, n in refs:
        want = _reference(q[first:first + n], k_cache, v_cache, slots, seen, 0.3)
        torch.testing.assert_close(out[first:first + n], want, rtol=2e-5, atol=2e-6)


def test_a_row_gets_the_same_bits_alone_in_any_batch_and_at_any_thread_count():
    k_cache, v_cache, q, seqs, runs, anc, _ = _case(torch.Generator().manual_seed(3))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        both = cpu_step.attend(q, k_cache, v_cache, 0.3, seqs, runs, anc, 24,
                               torch.empty(7, HQ * D))
        torch.set_num_threads(2)
        assert torch.equal(both, cpu_step.attend(q, k_cache, v_cache, 0.3, seqs, runs, anc, 24,
                                                 torch.empty(7, HQ * D)))
    finally:
        torch.set_num_threads(threads)
    # the chain's first row alone (a decode of it), and the tree's root alone
    for seq, row in ((torch.tensor([[0, 1, 21, 0, 3, -1]]), 0),
                     (torch.tensor([[0, 1, 9, 3, 2, 0]]), 3)):
        alone = cpu_step.attend(q[row:row + 1], k_cache, v_cache, 0.3, seq, runs, anc[:1], 24,
                                torch.empty(1, HQ * D))
        assert torch.equal(alone[0], both[row])
    x, w = torch.randn(9, 96), torch.randn(96)
    assert torch.equal(cpu_step.add_rms(x[4:5], None, w, 1e-6)[1][0],
                       cpu_step.add_rms(x, None, w, 1e-6)[1][4])


def test_a_long_sequence_goes_to_sdpa_and_agrees(monkeypatch):
    """A sequence past MAX_ROWS rows (a prefill) is attended by SDPA, the others by the kernel,
    in the same step: each agrees with the reference."""
    import verifier_service.kv.cpu_attention as cpu_attention

    monkeypatch.setattr(cpu_attention, "MAX_ROWS", 3)
    g = torch.Generator().manual_seed(4)
    k_cache, v_cache = torch.zeros(64, HKV, D), torch.zeros(64, HKV, D)
    # sequence 0: 2 cached + 5 fed in blocks 1, 3 (block size 4); sequence 1: 6 cached + 1 fed
    blocks = [[1, 3, 0], [5, 6, 0]]
    start, fed = [2, 6], [5, 1]
    slot = lambda b, c: blocks[b][c // 4] * 4 + c % 4  # noqa: E731
    for b in range(2):  # the cached columns' keys and values
        for c in range(start[b]):
            k_cache[slot(b, c)] = torch.randn(HKV, D, generator=g)
            v_cache[slot(b, c)] = torch.randn(HKV, D, generator=g)
    plan = _Plan(blocks, start, fed)
    positions = torch.tensor([2, 3, 4, 5, 6, 6])
    slots = torch.tensor([slot(0, c) for c in range(2, 7)] + [slot(1, 6)])
    attn = CpuAttention.for_plan(plan, {"positions": positions, "slots": slots}, 4, k_cache)
    assert len(attn.long) == 1 and attn.seqs.shape[0] == 1
    qkv = torch.randn(6, (HQ + 2 * HKV) * D, generator=g)
    cos, sin = torch.ones(8, D), torch.zeros(8, D)  # no rotation: the queries are qkv's
    out = attn(qkv, (cos, sin), k_cache, v_cache, HQ, HKV, 0.25)
    q = qkv[:, :HQ * D].view(6, HQ, D)
    seq0 = torch.tensor([slot(0, c) for c in range(7)])
    seen0 = torch.cat([torch.ones(5, 2, dtype=torch.bool), torch.ones(5, 5, dtype=torch.bool)
                       .tril()], 1)
    torch.testing.assert_close(out[:5], _reference(q[:5], k_cache, v_cache, seq0, seen0, 0.25),
                               rtol=2e-5, atol=2e-6)
    seq1 = torch.tensor([slot(1, c) for c in range(7)])
    torch.testing.assert_close(out[5:], _reference(q[5:], k_cache, v_cache, seq1,
                                                   torch.ones(1, 7, dtype=torch.bool), 0.25),
                               rtol=2e-5, atol=2e-6)


class _Plan:
    """The fields CpuAttention.for_plan reads of a StepPlan."""

    def __init__(self, blocks, start, fed):
        import numpy as np

        self.bucket, self.ancestors = None, None
        self._a = {"block_tables": np.array(blocks), "start": np.array(start),
                   "context_lens": np.array([s + f for s, f in zip(start, fed)])}
        self.fields = self
        self.sizes = (("B", len(blocks)),)
        self.host = torch.zeros(1)

    def arrays(self, _host):
        return self._a
