"""Every service serves grpc.health.v1 and server reflection."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from splitspec.methods import METHODS

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("which, service", [
    ("proposer", "splitspec.v1.Proposer"),
    ("verifier", "splitspec.v1.Verifier"),
    ("gateway", "splitspec.v1.Generation"),
])
def test_health_and_reflection(stack, which, service):
    port = (stack.proposers["ngram"] if which == "proposer" else getattr(stack, which)).port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for name in ("", service):
            resp = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        (resp,) = refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        names = {s.name for s in resp.list_services_response.service}
        assert {service, "grpc.health.v1.Health"} <= names


def test_verifier_info_lists_the_connected_proposer(stack):
    from protos import common_pb2, verifier_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{stack.verifier.port}") as ch:
        info = verifier_pb2_grpc.VerifierStub(ch).Info(common_pb2.Empty(), timeout=5)
    assert info.vocab_size > 0 and len(info.tokenizer_fingerprint) == 16
    model_free = [m for m, spec in METHODS.items() if not spec.capabilities.needs_model]
    assert [(p.method, p.connected) for p in info.proposers] == [(m, True) for m in model_free]


def test_verifier_stats_count_exactly_what_a_request_did(stack):
    """WatchStats counters move by what one request did, as its own usage reports it."""
    from learned_testlib import GenClient
    from stats_testlib import idle, method, watch_until

    port = stack.verifier.port
    before = watch_until(port, idle)  # nothing left in flight by earlier tests
    client = GenClient(stack.config.grpc_port)
    try:
        res = client.generate(client.request("alpha beta gamma delta " * 8, "ngram", k=4,
                                             max_tokens=24))
    finally:
        client.close()
    spec = res.usage.speculation
    assert len(res.token_ids) == 24 and spec.proposed_tokens > 0 and spec.accepted_tokens > 0
    after = watch_until(port, lambda s: idle(s) and s.finished_requests > before.finished_requests)
    assert after.finished_requests - before.finished_requests == 1
    assert after.aborted_requests == before.aborted_requests
    assert after.generated_tokens - before.generated_tokens == 24
    assert after.steps - before.steps >= spec.steps > 0
    assert after.step_seconds_total > before.step_seconds_total
    assert after.kv_blocks_total == before.kv_blocks_total > 0
    ngram_before, ngram_after = method(before, "ngram"), method(after, "ngram")
    assert ngram_after.proposed_tokens - ngram_before.proposed_tokens == spec.proposed_tokens
    assert ngram_after.accepted_tokens - ngram_before.accepted_tokens == spec.accepted_tokens
    # the drafts with a rejected token: what the gateway prices the request's class with
    assert (ngram_after.greedy.rejections - ngram_before.greedy.rejections
            == spec.rejections > 0) or spec.accepted_tokens == spec.proposed_tokens
    assert ngram_after.steps > ngram_before.steps
