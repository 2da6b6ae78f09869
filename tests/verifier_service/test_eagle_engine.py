"""EAGLE heads inside the engine (verifier_service/methods/eagle/method.py, registry method
`eagle`): random heads of both formats on the tiny target, chains and EAGLE-2 trees, batched with
plain requests: greedy output equals speculation off, seeded sampled output is identical on and off
(sampled chains drawn together too), and nothing leaks; a step's sequences drafted and
advanced together draft what each drafts on its own (the toy target's trained head); a head
that does not fit the target is refused at start-up."""

from __future__ import annotations

import asyncio
import dataclasses

import planted_bugs as bug
import pytest
import torch
from eagle_testlib import head_for_target, serve_eagle_beside_plain, speculators_head_for_target
from engine_testlib import drained, make_engine, request_ids, run_all

from splitspec.params import SamplingParams
from verifier_service.methods.eagle import head as eagle_head
from verifier_service.methods.eagle import method as eagle
from verifier_service.methods.in_target import PendingDraft

PROMPTS = [[5, 17, 42, 8, 33, 61, 12, 70, 3, 25] * 2, [100, 200, 300, 7, 9, 11] * 3,
           list(range(40, 70))]


@pytest.fixture(scope="module", params=[3, 1], ids=["eagle3", "eagle1"])
def head(request, tiny_target_dir, tmp_path_factory):
    return str(head_for_target(tmp_path_factory.mktemp(f"eagle{request.param}"),
                               tiny_target_dir, request.param))


def _plan(inp, branches: int):
    return dataclasses.replace(inp, speculation=dataclasses.replace(
        inp.speculation, num_branches=branches))


def _serve(engine, inputs):
    return [tokens for tokens, _, _ in asyncio.run(run_all(engine, inputs))]


def test_greedy_chains_and_trees_equal_speculation_off(tiny_target_dir, head):
    prompts = PROMPTS + [PROMPTS[2]]
    off = _serve(make_engine(tiny_target_dir, proposers={}),
                 [request_ids(f"o{i}", p, max_tokens=24) for i, p in enumerate(prompts)])
    engine = make_engine(tiny_target_dir, proposers={}, eagle=head, max_num_batched_tokens=16)
    inputs = [request_ids("chain", PROMPTS[0], max_tokens=24, method="eagle", k=4),
              _plan(request_ids("tree", PROMPTS[1], max_tokens=24, method="eagle", k=6), 2),
              request_ids("plain", PROMPTS[2], max_tokens=24),
              request_ids("chain2", PROMPTS[2], max_tokens=24, method="eagle", k=2)]
    assert _serve(engine, inputs) == off
    usage = engine.stats.method("eagle")
    assert usage.proposed_tokens > 0
    assert drained(engine) and engine.drafts.in_target.num_states == 0
    # on the CPU the head runs eagerly: the step's chains are drafted together, and every
    # sequence's rows advanced together at the next step's start
    c = engine.drafts.in_target.methods["eagle"].counters
    assert 0 < c["chain_batches_total"] < c["eager_chains_total"]
    assert 0 < c["advance_batches_total"] < c["eager_advances_total"]
    # its drafting time is kept by how many sequences drafted together (priced per batch)
    assert any(cls > 1 for _, cls in engine.stats.method("eagle").round_trips_by_seqs)
    # the head's learning from each verified step is its standing cost per sequence and step
    # (what a paused sequence still pays: adaptive k prices it on both sides)
    assert usage.standing[0] >= usage.drafts > 0 and usage.standing[1] > 0


@pytest.mark.parametrize("version", [3, 1], ids=["eagle3", "eagle1"])
def test_a_speculators_format_head_greedy_equals_speculation_off(tiny_target_dir, tmp_path,
                                                                 version):
    """A head saved in the speculators format (what vLLM serves) drafts inside the engine:
    greedy chains and trees give the output of speculation off."""
    path = speculators_head_for_target(tmp_path / "speculators", tiny_target_dir, version)
    off = _serve(make_engine(tiny_target_dir, proposers={}),
                 [request_ids(f"o{i}", p, max_tokens=16) for i, p in enumerate(PROMPTS[:2])])
    engine = make_engine(tiny_target_dir, proposers={}, eagle=str(path))
    assert dict(engine.drafts.in_target.methods["eagle"].head.spec.verifier)
    assert _serve(engine, [
        request_ids("chain", PROMPTS[0], max_tokens=16, method="eagle", k=4),
        _plan(request_ids("tree", PROMPTS[1], max_tokens=16, method="eagle", k=4), 2)]) == off
    assert engine.stats.method("eagle").proposed_tokens > 0
    assert drained(engine) and engine.drafts.in_target.num_states == 0


def test_seeded_sampled_output_is_identical_on_and_off(tiny_target_dir, head):
    seeded = SamplingParams(temperature=0.9, seed=5)
    engine = make_engine(tiny_target_dir, proposers={}, eagle=head)
    off, chain, tree, chain2 = _serve(engine, [
        request_ids("off", PROMPTS[0], max_tokens=20, sampling=seeded),
        request_ids("chain", PROMPTS[0], max_tokens=20, method="eagle", k=4, sampling=seeded),
        _plan(request_ids("tree", PROMPTS[0], max_tokens=20, method="eagle", k=5,
                          sampling=seeded), 3),
        request_ids("chain2", PROMPTS[0], max_tokens=20, method="eagle", k=2, sampling=seeded)])
    assert chain == off and tree == off and chain2 == off
    assert engine.stats.method("eagle").proposed_tokens > 0
    # the two sampled chains of a step were drawn together (no greedy chain ran)
    c = engine.drafts.in_target.methods["eagle"].counters
    assert 0 < c["chain_batches_total"] < c["eager_chains_total"]


def test_a_head_for_another_target_is_refused_at_start_up(target_model_dir, head):
    with pytest.raises(ValueError, match="eagle"):
        make_engine(target_model_dir, proposers={}, eagle=head)


def check_sequences_drafted_together_verify_what_each_alone_verifies(target_dir) -> None:
    """On the CPU a step's EAGLE sequences are advanced together at the next step's start and
    their greedy chains drafted together: the output and every count of accepted drafts are
    those of the same requests with each sequence advanced and drafted on its own (the toy
    target and its trained head: drafts are accepted)."""
    def serve(together: bool):
        engine = make_engine(target_dir, proposers={}, eagle=f"{target_dir}-eagle")
        with pytest.MonkeyPatch.context() as mp:
            if not together:
                for name in ("advance_many", "chain_many"):
                    mp.setattr(eagle, name, _one_by_one(getattr(eagle_head, name)))
            out, counts = serve_eagle_beside_plain(engine)
        c = engine.drafts.in_target.methods["eagle"].counters
        return out, counts, c["chain_batches_total"] < c["eager_chains_total"]

    together, alone = serve(True), serve(False)
    assert together[:2] == alone[:2] and together[1][0] > 0
    assert together[2]  # the chains were batched


def _one_by_one(batched):
    """advance_many / chain_many as a loop of one sequence at a time."""
    def each(seqs, *per_seq):
        outs = [batched([s], *[[x[i]] for x in per_seq]) for i, s in enumerate(seqs)]
        if outs[0] is None:
            return None
        width = max(o.shape[1] for o in outs)
        return torch.cat([torch.nn.functional.pad(o, (0, width - o.shape[1])) for o in outs])

    return each


def test_sequences_drafted_together_verify_what_each_alone_verifies(target_model_dir):
    check_sequences_drafted_together_verify_what_each_alone_verifies(target_model_dir)


def test_deferred_rows_dropped_fail_the_comparison(monkeypatch, target_model_dir):
    bug.eagle_deferred_rows_dropped(monkeypatch)
    with pytest.raises(AssertionError):
        check_sequences_drafted_together_verify_what_each_alone_verifies(target_model_dir)


def test_malformed_drafts_from_the_head_cost_only_speculation(tiny_target_dir, head,
                                                              monkeypatch):
    """Whatever the head hands the step that cannot be verified (more tokens than asked, ids
    outside the vocabulary, a tree that is not one, a q its token cannot come from) is dropped
    as a proposer's would be: the output is plain decoding's, nothing is verified, and the
    sequences' states are freed."""
    from kernels.sparse_probs import SparseProbs
    from splitspec.proposal import Draft

    bad = [lambda k: list(range(3, k + 4)),
           lambda k: [10 ** 6] * k,
           lambda k: Draft("", [3, 4], parents=[1, 0]),
           lambda k: Draft("", [3], q=SparseProbs.from_rows([([5], [1.0])]))]
    handed = []

    def propose_many(self, items):
        self.flush()  # the states still learn from each verified step
        handed.extend(bad[len(handed) % len(bad)](k) for _, _, k in items)
        return handed[-len(items):]

    off = _serve(make_engine(tiny_target_dir, proposers={}),
                 [request_ids(f"o{i}", p, max_tokens=12) for i, p in enumerate(PROMPTS)])
    monkeypatch.setattr(eagle.EagleMethod, "propose_many", propose_many)
    engine = make_engine(tiny_target_dir, proposers={}, eagle=head)
    got = _serve(engine, [request_ids(f"e{i}", p, max_tokens=12, method="eagle", k=3)
                          for i, p in enumerate(PROMPTS)])
    assert got == off and len(handed) >= 8
    assert engine.stats.method("eagle").proposed_tokens == 0
    assert drained(engine) and engine.drafts.in_target.num_states == 0


def test_an_eagle1_head_scores_the_frequency_ranked_subset_of_the_targets_head(
        tiny_target_dir, tmp_path, monkeypatch):
    """An EAGLE-1/2 head scores with the target's output head: with a token_frequencies.json
    in its directory it scores only the recommended top tokens (`--eagle-vocab-subset auto`),
    drafts nothing else, and the output is still plain decoding's. An EAGLE-3 head has its own
    draft vocabulary: a subset size for it is refused at start-up."""
    from collections import Counter

    from eagle_testlib import head_for_target

    from splitspec.vocab_frequencies import FREQUENCIES, write_frequencies

    d = head_for_target(tmp_path / "e1", tiny_target_dir, 1)
    ranked = Counter({t: 1000 - t for t in range(5, 45)})  # 40 tokens, the lowest ids first
    write_frequencies(d / FREQUENCIES, ranked, "test", recommended_subset=24)
    engine = make_engine(tiny_target_dir, proposers={}, eagle=str(d))
    method = engine.drafts.in_target.methods["eagle"]
    assert method.head.ids.tolist() == list(range(5, 29))
    drafted = []
    original = eagle.EagleMethod.propose_many

    def recording(self, items):
        out = original(self, items)
        drafted.extend(t for row in out  # chains left on the device: their ids
                       for t in (row.ids.tolist() if isinstance(row, PendingDraft) else row))
        return out

    off = _serve(make_engine(tiny_target_dir, proposers={}),
                 [request_ids(f"o{i}", p, max_tokens=12) for i, p in enumerate(PROMPTS)])
    monkeypatch.setattr(eagle.EagleMethod, "propose_many", recording)
    got = _serve(engine, [request_ids(f"e{i}", p, max_tokens=12, method="eagle", k=3)
                          for i, p in enumerate(PROMPTS)])
    assert got == off and drafted and set(drafted) <= set(range(5, 29))
    everything = make_engine(tiny_target_dir, proposers={}, eagle=str(d), eagle_vocab_subset="0")
    assert everything.drafts.in_target.methods["eagle"].head.ids is None
    e3 = head_for_target(tmp_path / "e3", tiny_target_dir, 3)
    with pytest.raises(ValueError, match="its own lm_head"):
        make_engine(tiny_target_dir, proposers={}, eagle=str(e3), eagle_vocab_subset="24")
