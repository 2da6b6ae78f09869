"""Every service serves grpc.health.v1 and server reflection."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("which, service", [
    ("proposer", "splitspec.v1.Proposer"),
    ("verifier", "splitspec.v1.Verifier"),
    ("gateway", "splitspec.v1.Generation"),
])
def test_health_and_reflection(stack, which, service):
    port = getattr(stack, which).port
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
    assert [(p.method, p.connected) for p in info.proposers] == [("ngram", True)]


def test_verifier_streams_its_stats(stack):
    from protos import verifier_pb2, verifier_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{stack.verifier.port}") as ch:
        stream = verifier_pb2_grpc.VerifierStub(ch).WatchStats(
            verifier_pb2.WatchStatsRequest(interval_ms=50), timeout=10)
        first, second = next(stream), next(stream)
        stream.cancel()
    assert first.kv_blocks_total > 0 and first.kv_blocks_free <= first.kv_blocks_total
    assert second.steps >= first.steps
