"""The draft model's fixed-cache drafting loop (proposer_service/draft/graphs.py), run eagerly
on the CPU: the same greedy drafts, alternatives and caches as the proposer's own loop, for a
batch of rows with different cache lengths and catch-up widths; sampled rows beside greedy ones
drafting what the eager loop's chooser drafts (seeded rows: the very tokens; every row: the
very q); and one iteration of each kind on meta tensors (what a captured graph may not do: read
the device back)."""

from __future__ import annotations

import threading

import planted_bugs as bug
import pytest
import torch
from capture_rules import GraphSafe

from proposer_service.config import ProposerConfig
from proposer_service.draft.cache import SeqState
from proposer_service.draft.graphs import DraftGraphs
from proposer_service.server import build_proposer
from splitspec.params import SamplingParams
from splitspec.proposal import SequenceStep

K = 5


@pytest.fixture(scope="module")
def proposer():
    return build_proposer(ProposerConfig(method="draft", model="models/draft", device="cpu",
                                         threads=1, linear="dense"))


def _histories():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, 4000, (n,), generator=g).tolist() for n in (23, 40, 9)]


def test_the_fixed_cache_loop_drafts_what_the_eager_loop_drafts(proposer):
    histories = _histories()
    states = [SeqState() for _ in histories]
    for state, h, skip in zip(states, histories, (1, 2, 1)):
        proposer._feed(state, h[:-skip])  # rows that still have 1, 2 and 1 tokens to catch up
    pending = [h[s.length():] for h, s in zip(histories, states)]
    lens = [s.length() for s in states]
    graphs = DraftGraphs(proposer.lean, torch.device("cpu"), 128, 4, 8, capture=False)
    tokens, alternatives, kvs, dists = graphs.draft([s.kv for s in states], lens, pending,
                                                    [len(h) for h in histories], K)
    assert dists == [None] * len(histories)  # greedy rows: one-hot drafts, no q
    work = [(SequenceStep(f"s{i}", h, len(h), K), h, s) for i, (h, s) in
            enumerate(zip(histories, states))]
    eager = proposer.draft_batch(work)
    assert tokens == [d.tokens for d in eager]
    for (want_ids, want_p), (got_ids, got_p) in zip(
            [a for s in states for a in s.alternatives],
            [a for row in alternatives for a in row]):
        assert got_ids == want_ids and got_p == pytest.approx(want_p, abs=1e-5)
    for state, kv in zip(states, kvs):  # the cache the eager loop left, column for column
        n = state.length()
        for (k0, v0), (k1, v1) in zip(state.kv, kv):
            torch.testing.assert_close(k1[:, :, :n], k0, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(v1[:, :, :n], v0, rtol=1e-5, atol=1e-5)


SAMPLED = [SamplingParams(temperature=0.0),
           SamplingParams(temperature=0.8, top_p=0.9, seed=11),
           SamplingParams(temperature=1.0, top_k=20),
           SamplingParams(temperature=0.7, seed=5, min_p=0.05)]


def check_sampled_rows_match(proposer) -> None:
    """A batch of greedy, seeded and unseeded rows through the fixed-cache loop: greedy and
    seeded rows draft the eager loop's very tokens, every sampled row sends the very q the eager
    loop sends (the truncated q its token was drawn from; an unseeded row's at its first
    position, its later ones follow its own draws), and each unseeded token is in its q."""
    g = torch.Generator().manual_seed(8)
    histories = [torch.randint(3, 4000, (n,), generator=g).tolist() for n in (30, 17, 25, 12)]
    states = [SeqState() for _ in histories]
    for state, h in zip(states, histories):
        proposer._feed(state, h[:-1])
    pending = [h[s.length():] for h, s in zip(histories, states)]
    graphs = DraftGraphs(proposer.lean, torch.device("cpu"), 128, 4, 8, capture=False,
                         top_k=proposer.draft_top_k)
    tokens, _, _, dists = graphs.draft([s.kv for s in states], [s.length() for s in states],
                                       pending, [len(h) for h in histories], K, SAMPLED)
    work = [(SequenceStep(f"s{i}", h, len(h), K, sampling=p), h, s) for i, (h, s, p) in
            enumerate(zip(histories, states, SAMPLED))]
    eager = proposer.draft_batch(work)
    assert dists[0] is None and eager[0].q is None
    for i in (0, 1, 3):  # greedy and seeded rows: the very tokens
        assert tokens[i] == eager[i].tokens, i
    for i, positions in ((1, K), (2, 1), (3, K)):  # unseeded: its later q follow its own draws
        want = eager[i].q.rows()
        assert len(dists[i]) == K
        for (got_ids, got_p), (want_ids, want_p) in zip(dists[i][:positions], want):
            assert got_ids == list(want_ids) and got_p == pytest.approx(list(want_p), abs=1e-6)
    for token, (ids, probs) in zip(tokens[2], dists[2]):  # unseeded: drawn from its q
        assert token in ids and sum(probs) == pytest.approx(1.0, abs=1e-5)


def test_sampled_rows_draft_what_the_eager_chooser_drafts(proposer):
    check_sampled_rows_match(proposer)


def test_a_static_choice_blind_to_seeds_fails_the_comparison(proposer, monkeypatch):
    bug.static_draft_choice_ignores_seeds(monkeypatch)
    with pytest.raises(AssertionError):
        check_sampled_rows_match(proposer)


def check_grown_leaves_match(proposer) -> None:
    """A token tree's kept leaves grown on a device (draft_shared through the captured loop,
    each row its prefix of the shared cache): the eager shared loop's drafts, alternatives,
    q and row states, greedy and seeded."""
    history = _histories()[1]
    state = SeqState()
    proposer._feed(state, history)
    rows = [(len(history) - 3, 77, 4), (len(history) - 1, 12, 2), (len(history), 900, 3)]
    graphs = DraftGraphs(proposer.lean, torch.device("cpu"), 128, 4, 8, capture=False,
                         top_k=proposer.draft_top_k)
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=5)):
        step = SequenceStep("s", history, len(history), 4, sampling=params)
        eager = proposer.draft_shared(step, rows, state, threading.Event())
        proposer.graphs = graphs
        try:
            replayed = proposer._shared_replayed(step, rows, state)
        finally:
            proposer.graphs = None
        for (want, want_state), (got, got_state) in zip(eager, replayed):
            assert got.tokens == want.tokens and got_state.cached == want_state.cached
            assert [a for a, _ in got_state.alternatives] == [
                a for a, _ in want_state.alternatives]
            assert (got.q is None) == (want.q is None)
            if got.q is not None:
                for (gi, gp), (wi, wp) in zip(got.q.rows(), want.q.rows()):
                    assert list(gi) == list(wi) and list(gp) == pytest.approx(list(wp), abs=1e-6)
            for (k0, v0), (k1, v1) in zip(want_state.kv, got_state.kv):
                torch.testing.assert_close(k1, k0, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(v1, v0, rtol=1e-5, atol=1e-5)


def test_tree_leaves_grown_through_the_fixed_cache_loop_match_the_shared_loop(proposer):
    check_grown_leaves_match(proposer)


def test_leaf_rows_drafted_one_position_late_fail_the_comparison(proposer, monkeypatch):
    bug.fixed_cache_rows_drafted_one_position_late(monkeypatch)
    with pytest.raises(AssertionError):
        check_grown_leaves_match(proposer)


def test_an_iteration_never_reads_the_device():
    from transformers import AutoModelForCausalLM

    from splitspec.launcher import REPO_ROOT
    from splitspec.lean_llama import LeanDecoder

    model = AutoModelForCausalLM.from_pretrained(REPO_ROOT / "models" / "draft",
                                                 dtype=torch.float32)
    lean = LeanDecoder(model.to("meta"), "dense")
    graphs = DraftGraphs(lean, torch.device("meta"), 64, 2, 4, capture=False)
    with GraphSafe():  # values do not exist on meta: a read back would raise there too
        graphs.iteration(2, 2)
        graphs.iteration(2, 1)
        graphs.iteration(2, 2, sampled=True)  # the sampled rows' choice, too
        graphs.iteration(2, 1, sampled=True)
    assert graphs.tokens.device.type == "meta"


def test_a_proposer_whose_loop_is_captured_does_not_offer_drafting_ahead(proposer,
                                                                         monkeypatch):
    """Drafting ahead runs the eager loop: beside a replayed proposal it costs more than it
    hides, so the description offers it only where drafting is eager (here, the CPU)."""
    assert proposer.graphs is None and proposer.describe().drafts_ahead
    graphs = DraftGraphs(proposer.lean, torch.device("cpu"), 64, 1, 4, capture=False)
    monkeypatch.setattr(proposer, "graphs", graphs)
    assert proposer.describe().drafts_ahead  # nothing captured: still eager
    monkeypatch.setattr(graphs, "_graphs", {(1, 1): object()})
    assert not proposer.describe().drafts_ahead


def test_steps_the_captured_loop_does_not_serve_are_counted_and_logged_once(proposer,
                                                                            monkeypatch, caplog):
    """On a device that captures, a batch outside the captured shapes drafts eagerly: counted by
    its reason in the proposer's metrics, logged once per reason and shape."""
    from prometheus_client import CollectorRegistry

    from proposer_service.telemetry.metrics import ProposerMetrics
    from splitspec.graphs import EagerFallbacks

    graphs = DraftGraphs(proposer.lean, torch.device("cpu"), 64, 1, 4, capture=False)
    monkeypatch.setattr(graphs, "_graphs", {(1, 1, False): object()})  # one row captured
    monkeypatch.setattr(proposer, "graphs", graphs)
    monkeypatch.setattr(proposer, "fallbacks", EagerFallbacks("the draft loop"))
    registry = CollectorRegistry()
    metrics = ProposerMetrics(registry, "draft")
    metrics.fallbacks = proposer.fallbacks
    with caplog.at_level("WARNING", logger="splitspec.graphs"):
        for _ in range(2):
            work = [(SequenceStep(f"s{i}", h, len(h), 3), h, SeqState())
                    for i, h in enumerate(_histories()[:2])]
            assert all(len(d.tokens) == 3 for d in proposer.draft_batch(work))
    assert proposer.fallbacks.counts == {"batch": 2}
    assert [r.getMessage() for r in caplog.records] == [
        "the draft loop ran eagerly (batch): rows 2, width 1, k 3"]
    assert registry.get_sample_value("splitspec_proposer_eager_fallbacks_total",
                                     {"method": "draft", "reason": "batch"}) == 2
