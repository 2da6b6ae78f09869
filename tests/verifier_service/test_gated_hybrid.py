"""Gated hybrid drafts (verifier_service/drafts/collector.py, "hybrid:ngram|draft"): the later tier
is asked for a sequence's step exactly when the earlier tier drafted nothing for it, and what
the step verifies is the asked tiers' drafts; greedy output stays speculation off's."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from engine_testlib import PROMPTS, make_engine, request, run_all

from proposer_service.base import Proposer, ProposerSession
from proposer_service.ngram import NgramProposer
from splitspec.proposal import Draft, ProposerDescription

GATED = "hybrid:ngram|draft"


class LoggedNgram(Proposer):
    """Prompt lookup, logging every call: ("ngram", {sequence: draft length})."""

    def __init__(self, log: list):
        self.log = log

    def describe(self):
        return NgramProposer().describe()

    def open_session(self):
        session, log = NgramProposer().open_session(), self.log

        class Logged(ProposerSession):
            def propose(self, steps):
                drafts = session.propose(steps)
                log.append(("ngram", {d.seq_id: len(d.tokens) for d in drafts}))
                return drafts

            def release(self, seq_ids):
                session.release(seq_ids)

        return Logged()


class RepeatLast(Proposer):
    """A stand-in model drafter (registered as "draft"): always drafts, the last token twice;
    logs ("draft", {sequences asked})."""

    def __init__(self, log: list):
        self.log = log

    def describe(self):
        return ProposerDescription(method="draft")

    def open_session(self):
        log, history = self.log, {}

        class Repeat(ProposerSession):
            def propose(self, steps):
                log.append(("draft", {s.seq_id for s in steps}))
                out = []
                for s in steps:
                    h = history[s.seq_id] = (list(s.new_tokens) if s.full_history
                                             else history[s.seq_id] + list(s.new_tokens))
                    out.append(Draft(s.seq_id, [h[-1]] * min(s.k, 2)))
                return out

            def release(self, seq_ids):
                for i in seq_ids:
                    history.pop(i, None)

        return Repeat()


def run_gated(model_dir: str, method: str = GATED):
    log: list = []
    engine = make_engine(model_dir, {"ngram": LoggedNgram(log), "draft": RepeatLast(log)},
                         max_num_seqs=4)
    inputs = [request(engine, f"g{i}", p, max_tokens=20, method=method, k=4)
              for i, p in enumerate(PROMPTS[:4])]
    results = run_all_sync(engine, inputs)
    return log, results, engine


def run_all_sync(engine, inputs):
    import asyncio

    return asyncio.run(run_all(engine, inputs))


def check_the_gate(log: list) -> None:
    """Per step: the draft tier asked for exactly the sequences prompt lookup drafted nothing
    for; and both cases happened."""
    matched = missed = 0
    for i, (who, got) in enumerate(log):
        if who != "ngram":
            continue
        nxt = log[i + 1] if i + 1 < len(log) else None
        asked = nxt[1] if nxt is not None and nxt[0] == "draft" else set()
        empty = {seq for seq, n in got.items() if n == 0}
        assert asked == empty, (got, asked)
        matched += len(got) - len(empty)
        missed += len(empty)
    assert all(who == "ngram" or log[i - 1][0] == "ngram" for i, (who, _) in enumerate(log)), \
        "a draft tier asked without its earlier tier before it"
    assert matched > 0 and missed > 0, (matched, missed)


def test_the_later_tier_drafts_only_where_the_earlier_drafted_nothing(target_model_dir):
    log, results, engine = run_gated(target_model_dir)
    check_the_gate(log)
    _, plain, _ = run_gated(target_model_dir, method="ngram")
    assert [t for t, _, _ in results] == [t for t, _, _ in plain]
    # the steps verified drafts of both tiers, and some were accepted
    assert sum(last.usage.proposed_tokens for _, _, last in results) > 0
    stats = engine.snapshot().per_method
    assert stats[GATED].drafts > 0 and stats["draft"].steps < stats["ngram"].steps


@pytest.mark.parametrize("plant", [bug.hybrid_gate_ignored, bug.hybrid_gate_inverted])
def test_the_gate_check_catches_a_planted_bug(target_model_dir, monkeypatch, plant):
    plant(monkeypatch)
    log, _, _ = run_gated(target_model_dir)
    with pytest.raises(AssertionError):
        check_the_gate(log)
