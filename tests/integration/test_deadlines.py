"""A gRPC deadline, at the public front door or on the verifier's own API, aborts the request
in the verifier: it stops generating and every KV block it held is freed."""

from __future__ import annotations

import grpc
import pytest
from stats_testlib import idle, watch_until

from protos import common_pb2, generation_pb2_grpc, verifier_pb2_grpc

pytestmark = pytest.mark.integration


DEADLINE_S = 0.4


def long_request(prompt: str) -> common_pb2.GenerateRequest:
    """Far more tokens than fit in the deadline: 480 plain decode steps (no speculation, which
    would emit several tokens per step) take over 1.7 s at the stack's ~270 tokens/s on the
    2-core CI machine; only a stack several times faster would finish before DEADLINE_S."""
    return common_pb2.GenerateRequest(
        text=prompt, sampling=common_pb2.SamplingParams(temperature=0),
        stopping=common_pb2.StoppingCriteria(max_tokens=480, ignore_eos=True),
        speculation=common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_OFF))


def expire(stub, prompt: str) -> int:
    """Stream until the deadline passes; the number of tokens received."""
    got = 0
    with pytest.raises(grpc.RpcError) as err:
        for msg in stub.Generate(long_request(prompt), timeout=DEADLINE_S):
            got += len(msg.token_ids)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return got


@pytest.mark.parametrize("door", ["gateway", "verifier"])
def test_a_deadline_aborts_the_request_and_frees_its_blocks(stack, door):
    port = stack.verifier.port
    before = watch_until(port, idle)
    address = stack.config.grpc_port if door == "gateway" else port
    with grpc.insecure_channel(f"127.0.0.1:{address}") as ch:
        stub = (generation_pb2_grpc.GenerationStub(ch) if door == "gateway"
                else verifier_pb2_grpc.VerifierStub(ch))
        got = expire(stub, "def deadline(x):\n")
    assert got < 480
    after = watch_until(port, lambda s: idle(s) and s.aborted_requests > before.aborted_requests)
    assert after.aborted_requests - before.aborted_requests == 1
    assert after.finished_requests == before.finished_requests  # it did not run to its end
    assert after.generated_tokens - before.generated_tokens < 480
