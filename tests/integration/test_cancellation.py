"""A client that goes away mid-stream (a REST client closing its connection, a gRPC client
cancelling its call) cancels the verifier's request: every KV block it held is freed."""

from __future__ import annotations

import grpc
import httpx
import pytest
from stats_testlib import idle, watch_until

from protos import common_pb2, generation_pb2_grpc

pytestmark = pytest.mark.integration

# Long enough that it cannot finish on its own while the test watches (~480 decode steps).
LONG = {"max_tokens": 480, "temperature": 0, "ignore_eos": True}


def holding_blocks(before):
    return lambda s: s.running == 1 and s.kv_blocks_free < s.kv_blocks_total


def aborted_and_idle(before):
    return lambda s: idle(s) and s.aborted_requests > before.aborted_requests


def test_a_rest_client_that_disconnects_frees_its_kv_blocks(stack):
    port = stack.verifier.port
    before = watch_until(port, idle)
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json={
                "prompt": "def f(x):\n", "stream": True, **LONG,
                "speculation": {"mode": "on", "method": "ngram", "num_speculative_tokens": 3}}
                           ) as r:
            assert r.status_code == 200
            events = 0
            lines = r.iter_lines()
            for line in lines:
                events += bool(line)
                if events == 3:
                    break
            # Still connected: the request runs and holds blocks. (Closing `lines` would close the
            # connection, so it stays referenced until the block ends.)
            during = watch_until(port, holding_blocks(before))
            assert during.kv_blocks_free < during.kv_blocks_total
            lines.close()
        # leaving the block closes the connection mid-stream
    after = watch_until(port, aborted_and_idle(before))
    assert after.aborted_requests - before.aborted_requests == 1
    assert after.finished_requests == before.finished_requests  # it did not just run out
    assert after.kv_blocks_free == after.kv_blocks_total


def test_a_cancelled_grpc_call_frees_its_kv_blocks(stack):
    port = stack.verifier.port
    before = watch_until(port, idle)
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}") as ch:
        call = generation_pb2_grpc.GenerationStub(ch).Generate(common_pb2.GenerateRequest(
            text="class A:\n", sampling=common_pb2.SamplingParams(temperature=0),
            stopping=common_pb2.StoppingCriteria(max_tokens=LONG["max_tokens"], ignore_eos=True),
            speculation=common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_OFF)),
            timeout=60)
        for i, _ in enumerate(call):
            if i == 2:
                break
        watch_until(port, holding_blocks(before))
        call.cancel()
        with pytest.raises(grpc.RpcError) as err:
            list(call)
        assert err.value.code() == grpc.StatusCode.CANCELLED
    after = watch_until(port, aborted_and_idle(before))
    assert after.aborted_requests - before.aborted_requests == 1
    assert after.finished_requests == before.finished_requests
    assert after.kv_blocks_free == after.kv_blocks_total


def test_verifier_abort_ends_a_running_request_and_frees_its_kv_blocks(stack):
    """Verifier/Abort (what the gateway's routing may call for a request it gives up on): the
    request's stream ends with finish reason ABORT; an unknown id is reported as not found."""
    from protos import verifier_pb2, verifier_pb2_grpc

    port = stack.verifier.port
    before = watch_until(port, idle)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = verifier_pb2_grpc.VerifierStub(ch)
        call = stub.Generate(common_pb2.GenerateRequest(
            request_id="to-abort", text="class A:\n",
            sampling=common_pb2.SamplingParams(temperature=0),
            stopping=common_pb2.StoppingCriteria(max_tokens=LONG["max_tokens"], ignore_eos=True)),
            timeout=60)
        first = next(call)
        assert not first.finish_reason
        assert stub.Abort(verifier_pb2.AbortRequest(request_id="to-abort"), timeout=10).found
        rest = list(call)
        assert rest[-1].finish_reason == common_pb2.FINISH_REASON_ABORT
        assert len(first.token_ids) + sum(len(m.token_ids) for m in rest) < LONG["max_tokens"]
        assert not stub.Abort(verifier_pb2.AbortRequest(request_id="to-abort"), timeout=10).found
    after = watch_until(port, aborted_and_idle(before))
    assert after.aborted_requests - before.aborted_requests == 1
