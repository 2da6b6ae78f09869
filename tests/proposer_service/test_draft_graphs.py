"""The draft model's fixed-cache drafting loop (proposer_service/draft_graphs.py), run eagerly
on the CPU: the same greedy drafts, alternatives and caches as the proposer's own loop, for a
batch of rows with different cache lengths and catch-up widths; and one iteration on meta
tensors (what a captured graph may not do: read the device back)."""

from __future__ import annotations

import pytest
import torch

from proposer_service.config import ProposerConfig
from proposer_service.draft_cache import SeqState
from proposer_service.draft_graphs import DraftGraphs
from proposer_service.server import build_proposer
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
    tokens, alternatives, kvs = graphs.draft([s.kv for s in states], lens, pending,
                                             [len(h) for h in histories], K)
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


def test_an_iteration_never_reads_the_device():
    from transformers import AutoModelForCausalLM

    from splitspec.launcher import REPO_ROOT
    from splitspec.lean_llama import LeanDecoder

    model = AutoModelForCausalLM.from_pretrained(REPO_ROOT / "models" / "draft",
                                                 dtype=torch.float32)
    lean = LeanDecoder(model.to("meta"), "dense")
    graphs = DraftGraphs(lean, torch.device("meta"), 64, 2, 4, capture=False)
    graphs.iteration(2, 2)  # values do not exist on meta: a read back would raise
    graphs.iteration(2, 1)
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
