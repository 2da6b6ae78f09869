"""verifier_service/drafts.py: a proposer that turns incompatible while the verifier runs (a pod
replaced by a wrong image) costs only speculation: no request fails, outputs stay the target's,
the method shows as unavailable in stats and usage, and it is used again once compatible."""

from __future__ import annotations

import asyncio

from engine_testlib import PROMPTS, collect, make_engine, request

from proposer_service.ngram import NgramProposer
from verifier_service.drafts import INCOMPATIBLE
from verifier_service.proposer_client import InProcessProposerClient, ProposerMismatch


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
