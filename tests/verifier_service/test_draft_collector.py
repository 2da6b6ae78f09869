"""verifier_service/drafts/collector.py: a proposer that turns incompatible while the verifier
runs (a pod replaced by a wrong image) costs only speculation: no request fails, outputs stay the
target's, the method shows as unavailable in stats and usage, and it is used again once
compatible."""

from __future__ import annotations

import asyncio
import dataclasses

from engine_testlib import PROMPTS, collect, make_engine, request
from proposer_testlib import InProcessProposerClient

from proposer_service.ngram import NgramProposer
from verifier_service.drafts.client import ProposerMismatch
from verifier_service.drafts.collector import INCOMPATIBLE


class ReplaceableClient(InProcessProposerClient):
    """An n-gram proposer whose image can be swapped for one with another vocabulary."""

    def __init__(self):
        super().__init__(NgramProposer())
        self.incompatible = False

    async def ensure_connected(self) -> bool:
        if self.incompatible:
            raise ProposerMismatch("proposer 'ngram' has vocabulary size 99, the target has 4096")
        return True


def run_with_swap(model_dir: str):
    engine = make_engine(model_dir, max_num_seqs=8)
    client = ReplaceableClient()
    engine.proposers["ngram"] = engine.drafts.proposers["ngram"] = client

    async def scenario():
        engine.start()
        try:
            base = [await collect(engine, request(engine, f"b{i}", p)) for i, p in
                    enumerate(PROMPTS[:4])]
            client.incompatible = True
            during = await asyncio.gather(*(collect(engine, request(engine, f"d{i}", p, k=4))
                                            for i, p in enumerate(PROMPTS[:4])))
            stats_during = engine.snapshot().per_method["ngram"].unavailable
            client.incompatible = False
            after = await asyncio.gather(*(collect(engine, request(engine, f"a{i}", p, k=4))
                                           for i, p in enumerate(PROMPTS[:4])))
            return base, during, stats_during, after, engine.snapshot()
        finally:
            await engine.shutdown()

    return asyncio.run(scenario())


def test_a_proposer_turning_incompatible_costs_only_speculation(target_model_dir):
    base, during, unavailable, after, stats = run_with_swap(target_model_dir)
    assert [t for t, _, _ in during] == [t for t, _, _ in base]
    assert [t for t, _, _ in after] == [t for t, _, _ in base]
    for _, _, last in during:
        assert last.finish_reason == "length"
        assert last.usage.proposed_tokens == 0 and last.usage.reason == INCOMPATIBLE
    assert unavailable == INCOMPATIBLE
    # compatible again: drafts are used again and the method is available
    assert sum(last.usage.proposed_tokens for _, _, last in after) > 0
    assert all(last.usage.reason == "" for _, _, last in after)
    assert stats.per_method["ngram"].unavailable == ""


class ShortDrafts(NgramProposer):
    """Prompt lookup cut to at most 2 tokens, whatever k is asked: a proposer that often
    drafts fewer tokens than it is asked for."""

    def open_session(self):
        session = super().open_session()
        propose = session.propose
        session.propose = lambda steps: [dataclasses.replace(d, tokens=d.tokens[:2])
                                         for d in propose(steps)]
        return session


def test_per_position_counts_say_what_each_asked_position_forwarded_and_gained(
        target_model_dir):
    engine = make_engine(target_model_dir, {"ngram": ShortDrafts()}, max_num_seqs=8)

    async def scenario():
        engine.start()
        try:
            return await asyncio.gather(*(collect(engine, request(engine, f"r{i}", p, k=4,
                                                                  max_tokens=40))
                                          for i, p in enumerate(PROMPTS[:6])))
        finally:
            await engine.shutdown()

    results = asyncio.run(scenario())
    c = engine.snapshot().per_method["ngram"].greedy
    steps = [sc for _, _, last in results for sc in last.usage.step_counts]
    assert len(c.asked_at) == 4 and c.asked_at[0] == c.asked  # every asked step was verified
    assert all(x >= y for x, y in zip(c.asked_at, c.asked_at[1:]))
    assert c.asked_at[2] > 0 and len(c.drafted_at) == 2  # asked for 3+, never drafted
    assert c.drafted_at[0] == c.drafts > c.drafted_at[1] > 0
    assert sum(c.drafted_at) == c.proposed_tokens and sum(c.accepted_at) == c.accepted_tokens
    assert c.accepted_at == [sum(1 for _, a in steps if a >= j) for j in (1, 2)]
    # the same counts reach the gateway's policy through Verifier/WatchStats
    from gateway.stats_watch import snapshot_from_pb
    from verifier_service.servicer import _stats_to_pb

    wire = snapshot_from_pb(_stats_to_pb(engine.snapshot())).methods["ngram"].greedy
    assert (wire.asked_at, wire.drafted_at, wire.accepted_at) == (
        tuple(c.asked_at), tuple(c.drafted_at), tuple(c.accepted_at))


def test_a_sequences_first_ask_is_not_a_point_of_the_round_trip_model(target_model_dir):
    """The first ask carries the whole history (a draft model prefills the prompt): it is not
    the step's usual round trip, and with few calls it would dominate the fit."""
    engine = make_engine(target_model_dir)

    async def scenario():
        engine.start()
        try:
            return await collect(engine, request(engine, "r", PROMPTS[0], k=3, max_tokens=24))
        finally:
            await engine.shutdown()

    asyncio.run(scenario())
    ngram = engine.stats.method("ngram")
    assert ngram.steps > 2 and ngram.missed_steps == 0
    assert sum(n for n, _ in ngram.round_trips.values()) == ngram.steps - 1
