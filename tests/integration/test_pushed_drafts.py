"""Pushed drafts through a real draft proposer process: the verifier's client asks to draft ahead,
gets the drafts pushed as soon as they are ready, answers a step whose outcome was pushed with
no round trip, and the proposer continues from exactly the draft the verifier took.

The pushes are awaited here (the test plays the verifier and waits for them), so nothing depends
on whether drafting ahead beats a verification on this machine.
"""

from __future__ import annotations

import asyncio
import sys

import grpc
import pytest
from polling import wait_until_async
from services_testlib import start_healthy

from protos import common_pb2, proposer_pb2_grpc
from splitspec.launcher import Service
from splitspec.net import free_port
from splitspec.proposal import AHEAD_PUSHED, SequenceStep, description_from_pb
from verifier_service.drafts.client import GrpcProposerClient

pytestmark = pytest.mark.integration

K = 4


@pytest.fixture(scope="module")
def draft_address(learned_models, tmp_path_factory):
    _, draft, _ = learned_models  # a noisy copy of the sharpened tiny target
    root = tmp_path_factory.mktemp("pushed")
    port = free_port()
    svc = Service("proposer-draft", [sys.executable, "-m", "proposer_service.server",
                                     "--method", "draft", "--model", str(draft),
                                     "--port", str(port), "--threads", "1"],
                  port, root / "proposer.log")
    try:
        start_healthy(svc, 120)
        yield f"127.0.0.1:{port}"
    finally:
        svc.stop()


async def _client(address: str) -> GrpcProposerClient:
    async with grpc.aio.insecure_channel(address) as channel:
        info = await proposer_pb2_grpc.ProposerStub(channel).Info(common_pb2.Empty(), timeout=10)
    desc = description_from_pb(info)
    assert desc.drafts_ahead, "the draft proposer drafts ahead"
    client = GrpcProposerClient("draft", address, desc.vocab_size, desc.tokenizer_fingerprint)
    await client.connect()
    return client


async def _pushed(client: GrpcProposerClient, seq_id: str, history_len: int, timeout=30.0):
    """What the proposer pushed for the sequence's next step (waits for it)."""
    return await wait_until_async(
        lambda: [a for a in client._pushed.get(seq_id, ()) if a.history_len > history_len],
        timeout, 0.01, f"a push for {seq_id!r} past {history_len} tokens")


def test_a_pushed_draft_is_taken_without_a_round_trip_and_the_proposer_follows(draft_address):
    async def scenario():
        ahead, fresh = await _client(draft_address), await _client(draft_address)
        try:
            history = list(range(5, 25))
            (d1,) = await ahead.propose([SequenceStep("s", list(history), len(history), K,
                                                      full_history=True, draft_ahead=True)], 30)
            assert len(d1.tokens) == K
            pushed = await _pushed(ahead, "s", len(history))
            # all accepted (+ the bonus guess) and the likeliest rejections, each for its own
            # history length
            assert any(a.outcome[:-1] == tuple(d1.tokens) for a in pushed)
            assert len({a.outcome for a in pushed}) == len(pushed) >= 2
            for a in pushed:
                assert a.history_len == len(history) + len(a.outcome)
            # a rejection outcome: the step is answered from the push, no answer awaited
            a = next(a for a in pushed if a.outcome[:-1] != tuple(d1.tokens))
            history += list(a.outcome)
            step = SequenceStep("s", list(a.outcome), len(history), K, draft_ahead=True)
            (d2,) = await ahead.propose([step], 30)
            assert d2.ahead_outcome == AHEAD_PUSHED and d2.tokens == a.draft.tokens[:K]
            # the same draft a fresh stream drafts for that history (greedy, same positions)
            (f2,) = await fresh.propose([SequenceStep("s", list(history), len(history), K,
                                                      full_history=True)], 30)
            assert f2.tokens == d2.tokens
            # the proposer continued from the taken draft: it pushes the outcomes of d2
            pushed = await _pushed(ahead, "s", len(history))
            assert any(p.outcome[:-1] == tuple(d2.tokens) for p in pushed)
            # an outcome nobody pushed: asked and answered as usual (the proposer drafts
            # afresh), consistent with a fresh stream again
            outcome = [d2.tokens[0], (d2.tokens[1] + 1) % ahead.description.vocab_size]
            if any(p.outcome == tuple(outcome) for p in pushed):
                outcome[-1] = (outcome[-1] + 1) % ahead.description.vocab_size
            history += outcome
            (d3,) = await ahead.propose([SequenceStep("s", outcome, len(history), K,
                                                      draft_ahead=True)], 30)
            assert d3.ahead_outcome != AHEAD_PUSHED
            (f3,) = await fresh.propose([SequenceStep("s", list(history), len(history), K,
                                                      full_history=True)], 30)
            assert f3.tokens == d3.tokens
            # the outcome-only message got no answer: nothing arrived for an unknown step
            assert ahead.late_answers == 0
        finally:
            await ahead.close()
            await fresh.close()

    asyncio.run(scenario())
