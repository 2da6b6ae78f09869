"""The step plan (verifier_service/step/plan.py): bucket choice at every boundary, fixed array
offsets per bucket, and the arrays of a known step, padding included."""

from __future__ import annotations

import pytest

from kernels.layout import StepLayout
from verifier_service.step.plan import (
    MAX_BUCKET_NODES,
    Bucket,
    BucketLadder,
    PlanFields,
    plan_step,
)

BS, TRASH = 4, 99


def test_the_ladder_always_holds_the_largest_step():
    ladder = BucketLadder.powers_of_two(6, 9)
    assert ladder.seqs == (1, 2, 4, 6) and ladder.rows == (1, 2, 4, 8, 9)
    assert Bucket(6, 9) in list(ladder)
    assert list(ladder) == sorted(ladder, reverse=True)  # captured largest first
    assert BucketLadder.powers_of_two(1, 1).seqs == (1,)


def test_bucket_choice_is_the_smallest_that_holds_the_step_at_every_boundary():
    ladder = BucketLadder((1, 2, 4, 8), (1, 2, 4, 6))
    for n in range(1, 10):
        for r in range(1, 8):
            got = ladder.choose(n, r)
            fits = [b for b in ladder if b.num_seqs >= n and b.rows >= r]
            if not fits:
                assert got is None, (n, r)
                continue
            best = min(fits, key=lambda b: (b.num_seqs, b.rows))
            assert got == best, (n, r, got)
            assert got.num_seqs >= n and got.rows >= r
    assert BucketLadder().choose(1, 1) is None  # the CPU's empty ladder: exact shapes


def test_a_ladder_refuses_rows_its_tree_bits_cannot_address():
    with pytest.raises(ValueError):
        BucketLadder((1,), (MAX_BUCKET_NODES + 2,))
    assert max(BucketLadder.powers_of_two(4, 200).rows) == MAX_BUCKET_NODES + 1


def _decode_step(drafts, trees=None, starts=None):
    """Every sequence decoding: 1 uncached token + its drafts."""
    ks = [len(d) for d in drafts]
    starts = starts or [5 + 3 * i for i in range(len(ks))]
    layout = StepLayout.build([k + 1 for k in ks], starts, ks, [True] * len(ks), trees)
    ids = [t for i, d in enumerate(drafts) for t in [100 + i, *d]]
    tables = [[2 * i, 2 * i + 1, 20 + i, 30 + i] for i in range(len(ks))]
    return layout, ids, tables


def test_a_buckets_arrays_sit_at_offsets_fixed_by_the_bucket():
    ladder = BucketLadder((4,), (4,))
    a = plan_step(*_decode_step([[1, 2], []]), BS, TRASH, ladder, max_blocks=6)
    b = plan_step(*_decode_step([[7], [8, 9, 3], [4]]), BS, TRASH, ladder, max_blocks=6)
    assert a.bucket == b.bucket == Bucket(4, 4)
    assert a.fields == b.fields == PlanFields.for_bucket(Bucket(4, 4), 6)
    assert a.fields.offsets == b.fields.offsets and a.host.numel() == b.host.numel()


def test_a_padded_step_feeds_padding_into_the_trash_block():
    layout, ids, tables = _decode_step([[11, 12], []], trees=[[-1, -1], None], starts=[5, 2])
    plan = plan_step(layout, ids, tables, BS, TRASH, BucketLadder((1, 4), (1, 2, 4)),
                     max_blocks=4)
    assert plan.bucket == Bucket(4, 4) and not plan.chain
    v = {k: x.tolist() for k, x in plan.fields.views(plan.host).items()}
    assert v["ids"] == [100, 11, 12, 0, 101, 0, 0, 0] + [0] * 8
    assert v["positions"][:3] == [5, 6, 6] and v["positions"][4] == 2  # siblings at one depth
    # sequence 0: columns 5, 6, 7 in block 1 (slots 5..7); sequence 1: column 2 of block 2
    assert v["slots"][:3] == [5, 6, 7] and v["slots"][4] == 10
    real = {0, 1, 2, 4}
    trash = range(TRASH * BS, TRASH * BS + BS)
    assert all(s in trash for r, s in enumerate(v["slots"]) if r not in real)
    assert v["block_tables"] == [[0, 1, 20, 30], [2, 3, 21, 31]] + [[TRASH] * 4] * 2
    assert v["context_lens"] == [8, 3, 0, 0]
    # the two draft nodes (fed rows 1, 2) are siblings: each sees only itself among the nodes
    assert v["first_node"][:2] == [1, 1] and v["node_bits"][:3] == [0, 1, 2]
    assert v["draft_ids"][:2] == [[11, 12, 0], [0, 0, 0]]
    assert v["draft_valid"][:2] == [[1, 1, 0], [0, 0, 0]]
    assert v["bonus_base"][:2] == [0, 4] and v["real_rows"][:4] == [0, 1, 2, 4]


def test_prefill_and_oversized_steps_run_at_their_exact_shape():
    ladder = BucketLadder.powers_of_two(8, 9)
    prefill = StepLayout.build([5, 1], [0, 7], [0, 0], [True, True])
    plan = plan_step(prefill, list(range(6)), [[0, 1], [2, 3]], BS, TRASH, ladder, 8)
    assert plan.bucket is None and plan.num_tokens == 6
    big = [[1] * 9]  # 10 rows: more than the ladder's largest bucket holds
    assert plan_step(*_decode_step(big), BS, TRASH, ladder, 8).bucket is None
    chunk = StepLayout.build([3], [0], [0], [False])  # a chunk that emits nothing
    assert plan_step(chunk, [1, 2, 3], [[0]], BS, TRASH, ladder, 8).bucket is None


def test_an_exact_plan_is_the_layouts_packing():
    layout = StepLayout.build([3, 2], [4, 0], [2, 0], [True, False])
    plan = plan_step(layout, [7, 8, 9, 1, 2], [[5, 6], [3]], BS, TRASH)
    v = {k: x.tolist() for k, x in plan.fields.views(plan.host).items()}
    assert plan.bucket is None and plan.num_tokens == 5
    assert v["slots"] == [24, 25, 26, 12, 13]  # block 6 at columns 4..6; block 3 at 0..1
    assert v["logits_rows"] == layout.logits_indices.tolist() == [0, 1, 2]
    assert v["query_index"] == [[0, 1, 2], [3, 4, 5]] and v["packed_index"] == [0, 1, 2, 3, 4]
    assert v["draft_ids"] == [[8, 9]] and v["target_idx"] == [[0, 1]]
