"""Routing over verifier replicas: an unreachable replica is skipped before the first token."""

from __future__ import annotations

import asyncio

import pytest

from gateway.verifier_pool import VerifierPool
from splitspec.net import free_port
from protos import common_pb2

pytestmark = pytest.mark.integration


def test_requests_fail_over_to_a_live_replica(stack):
    async def scenario():
        pool = VerifierPool((f"127.0.0.1:{free_port()}", f"127.0.0.1:{stack.verifier.port}"))
        try:
            info = await pool.info()
            assert info.model and info.vocab_size > 0
            req = common_pb2.GenerateRequest(
                text="def f(x):", sampling=common_pb2.SamplingParams(temperature=0),
                stopping=common_pb2.StoppingCriteria(max_tokens=3))
            for i in range(4):  # round robin starts on the dead replica half of the time
                req.request_id = f"route-{i}"
                chunks = [m async for m in pool.generate(req)]
                assert chunks[-1].usage.completion_tokens == 3
            assert [r.in_flight for r in pool.replicas] == [0, 0]
            assert await pool.healthy()
        finally:
            await pool.close()

    asyncio.run(scenario())
