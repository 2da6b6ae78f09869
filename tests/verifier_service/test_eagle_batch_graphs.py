"""The batched chains and advance (verifier_service/methods/eagle/batch_graphs.py): a step's
sequences drafted together over one static cache, one iteration per level for all of them,
draft each sequence's own chain (different lengths and k, more sequences than the largest
bucket) and leave the sequences' own state as it was; sampled, each row draws what the head's
eager sampled_chain_many draws for it (its own parameters, q and keyed noise; unseeded rows
from the same q); advanced together, each ends in the state its own advance leaves (different
row counts and widths); the bodies are ones a graph can record (no host read, no host value
copied in). Through the engine, with them taken as captured on the CPU, the toy target's
trained head verifies what the per-sequence replays verify, and seeded sampled output is
identical on and off."""

from __future__ import annotations

import planted_bugs as bug
import pytest
import torch
from capture_rules import GraphSafe
from eagle_testlib import (
    PROMPT_TOKENS,
    eagle3_sequence,
    serve_eagle_beside_plain,
    target_features,
    tiny_target,
)
from engine_testlib import make_engine

from splitspec.params import SamplingParams
from verifier_service.methods.eagle.batch_graphs import EagleBatch
from verifier_service.methods.eagle.graphs import EagleGraphs
from verifier_service.methods.eagle.head import sampled_chain_many

PROMPTS = [PROMPT_TOKENS, [40, 21, 33, 7, 9, 11] * 2, PROMPT_TOKENS[:3], list(range(50, 75)),
           [8, 8, 9, 60, 2]]


def sequences(n: int):
    """n sequences of one EAGLE-3 head (eagle3_sequence's), each advanced over its prompt."""
    first = eagle3_sequence(PROMPTS[0])
    model = tiny_target(seed=21)
    seqs = [first]
    for prompt in PROMPTS[1:n]:
        seq = first.head.new_sequence(64)
        _, aux, greedy = target_features(model, prompt, [0, 2, 4])
        seq.advance(aux, torch.tensor(prompt[1:] + [int(greedy[-1])]))
        seqs.append(seq)
    return seqs


def check_batched_chains_match_each_alone() -> None:
    seqs = sequences(5)
    batch = EagleBatch(seqs[0].head, capacity=64, max_k=5, max_batch=4)
    ks = [4, 2, 5, 1, 3]  # 5 sequences: a group of 4, then one
    lengths = [s.length for s in seqs]
    alone = [s.chain(k).tolist() for s, k in zip(seqs, ks)]
    assert len(set(map(tuple, alone))) > 2  # different drafts, or the comparison proves nothing
    got = [row.tolist() for row in batch.chains(seqs, ks)]
    assert got == alone
    assert [s.length for s in seqs] == lengths  # their own state untouched
    assert [s.chain(k).tolist() for s, k in zip(seqs, ks)] == alone


def test_sequences_drafted_together_draft_each_ones_chain():
    check_batched_chains_match_each_alone()


def test_rows_written_at_the_first_rows_column_fail_the_comparison(monkeypatch):
    bug.eagle_batch_rows_written_at_the_first_column(monkeypatch)
    with pytest.raises(AssertionError):
        check_batched_chains_match_each_alone()


PARAMS = [SamplingParams(temperature=0.9, top_k=20, seed=5),
          SamplingParams(temperature=1.3, top_p=0.9, seed=7),
          SamplingParams(temperature=1.1),  # unseeded
          SamplingParams(temperature=0.7, min_p=0.1, seed=3),
          SamplingParams(temperature=1.2, seed=9)]


def check_batched_sampled_chains_match_the_eager_ones() -> None:
    """Five sequences (a group of four, then one), their own parameters and k: each seeded row
    draws the tokens and q rows the eager batched draw gives it; the unseeded row's q is the
    same and its tokens lie in it."""
    seqs = sequences(5)
    batch = EagleBatch(seqs[0].head, capacity=64, max_k=5, max_batch=4, top_k=8)
    ks = [4, 2, 5, 1, 3]
    first = [s.length + 1 for s in seqs]
    lengths = [s.length for s in seqs]
    want = sampled_chain_many(seqs, ks, PARAMS, first, top_k=8)
    got = batch.sampled_chains(seqs, ks, PARAMS, first)
    assert [s.length for s in seqs] == lengths
    for (tokens, ids, probs), w, k, p in zip(got, want, ks, PARAMS):
        assert tokens.shape == (k,) and ids.shape == probs.shape == (k, 8)
        keep = probs > 0
        rows = [(ids[i][keep[i]].tolist(), probs[i][keep[i]].tolist()) for i in range(k)]
        if p.seed is not None:
            assert tokens.tolist() == w.tokens
        # an unseeded row's later q rows follow the tokens it drew: its first is the root's
        same = w.q.rows() if p.seed is not None else w.q.rows()[:1]
        for (gi, gp), (wi, wp) in zip(rows, same):
            assert gi == wi
            torch.testing.assert_close(torch.tensor(gp), torch.tensor(wp))
        assert all(tok in gi for tok, (gi, _) in zip(tokens.tolist(), rows))
    assert len({tuple(t.tolist()) for t, _, _ in got}) > 2


def test_sampled_chains_drafted_together_draw_the_eager_draws():
    check_batched_sampled_chains_match_the_eager_ones()


def test_sampled_rows_sharing_the_first_params_fail_the_comparison(monkeypatch):
    bug.eagle_sampled_rows_share_the_first_params(monkeypatch)
    with pytest.raises(AssertionError):
        check_batched_sampled_chains_match_the_eager_ones()


def check_batched_advances_match_each_alone() -> None:
    """Rows handed to sequences of different lengths (1 to 5 rows: widths 1 to 8), advanced
    together, leave each in the state its own advance leaves: length, new columns, root."""
    alone, together = sequences(5), sequences(5)
    batch = EagleBatch(together[0].head, capacity=64, max_k=7, max_batch=4)
    g = torch.Generator().manual_seed(3)
    feature_size = alone[0].head.spec.feature_size
    rows = [2, 5, 1, 3, 4]
    feats = [torch.randn(r, feature_size, generator=g) for r in rows]
    ids = [torch.randint(0, 96, (r,), generator=g).tolist() for r in rows]
    for s, f, t in zip(alone, feats, ids):
        s.advance(f, torch.tensor(t))
    batch.advance(together, feats, ids)
    for a, t in zip(alone, together):
        assert t.length == a.length
        torch.testing.assert_close(t.keys[:, :, :a.length], a.keys[:, :, :a.length])
        torch.testing.assert_close(t.values[:, :, :a.length], a.values[:, :, :a.length])
        torch.testing.assert_close(t.root_logits, a.root_logits)
        assert int(t.root_token) == int(a.root_token)
    assert [t.chain(3).tolist() for t in together] == [a.chain(3).tolist() for a in alone]


def test_sequences_advanced_together_end_as_each_alone():
    check_batched_advances_match_each_alone()


def test_advanced_rows_seeing_later_rows_fail_the_comparison(monkeypatch):
    bug.eagle_batch_advance_rows_see_later_rows(monkeypatch)
    with pytest.raises(AssertionError):
        check_batched_advances_match_each_alone()


def test_the_batched_bodies_read_nothing_back():
    seqs = sequences(3)
    batch = EagleBatch(seqs[0].head, capacity=64, max_k=4, max_batch=4)
    batch.chains(seqs, [3, 3, 3])  # the buffers hold real roots
    feature_size = seqs[0].head.spec.feature_size
    batch.advance(seqs, [torch.randn(2, feature_size)] * 3, [[4, 5]] * 3)
    batch.sampled_chains(seqs, [3, 3, 3], PARAMS[:3], [9, 9, 9])
    batch.j.zero_()
    with GraphSafe():
        batch.iteration(4)
        batch.pick(4)
    batch.j.zero_()
    with GraphSafe():
        batch.iteration(4, sampled=True)
        batch.pick(4, sampled=True)
        batch.advance_rows(4, batch.widths[-1])


def test_chains_replayed_together_verify_what_each_sequences_replay_verifies(target_model_dir):
    """With the batched chain and advance taken as captured, a step's greedy EAGLE chains draft
    together over its static cache and are fed to the step from the device, and every
    sequence's kept rows advance together at the next step's start: the output and every count
    of accepted drafts are those of each sequence replaying its own chain and advance."""
    def serve(together: bool):
        engine = make_engine(target_model_dir, proposers={}, eagle=f"{target_model_dir}-eagle")
        method = engine.drafts.in_target.methods["eagle"]
        method.graphs = EagleGraphs(method.head, capacity=256, max_k=8, capture=False,
                                    max_batch=4 if together else 1)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(EagleGraphs, "captured", property(lambda self: True))
            mp.setattr(EagleBatch, "captured", property(lambda self: True))
            mp.setattr(EagleBatch, "captured_advance", property(lambda self: True))
            out, counts = serve_eagle_beside_plain(engine)
        c = method.counters
        return out, counts, (c["chain_batches_total"], c["advance_batches_total"])

    together, alone = serve(True), serve(False)
    assert together[:2] == alone[:2] and together[1][0] > 0
    assert min(together[2]) > 0 and alone[2] == (0, 0)


def test_sampled_chains_replayed_together_keep_seeded_output(target_model_dir):
    """With the batched sampled chain taken as captured, a step's seeded sampled EAGLE chains
    (k 4, 3 and 2) draw together over its static cache: the output is the output without
    speculation, and the chains were replayed in batches."""
    import asyncio

    from engine_testlib import PROMPTS as TEXT
    from engine_testlib import drained, request, run_all

    def serve(method: str | None):
        engine = make_engine(target_model_dir, proposers={}, eagle=f"{target_model_dir}-eagle")
        eagle = engine.drafts.in_target.methods["eagle"]
        eagle.graphs = EagleGraphs(eagle.head, capacity=256, max_k=8, capture=False,
                                   max_batch=4)
        seeded = [SamplingParams(temperature=0.8, seed=s) for s in (1, 2, 3)]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(EagleBatch, "captured_sampled", property(lambda self: True))
            mp.setattr(EagleBatch, "captured_advance", property(lambda self: True))
            out = asyncio.run(run_all(engine, [
                request(engine, f"s{i}", TEXT[i], max_tokens=16, method=method, k=k,
                        sampling=p) for i, (k, p) in enumerate(zip((4, 3, 2), seeded))]))
        assert drained(engine)
        return [t for t, _, _ in out], eagle.counters

    on, counters = serve("eagle")
    off, _ = serve(None)
    assert on == off
    assert counters["chain_batches_total"] > 0
    assert counters["graph_chains_total"] > 2 * counters["chain_batches_total"] - 1
