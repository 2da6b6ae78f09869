"""The gateway's lifecycle: start opens the gRPC door, whose health follows the verifiers'
(NOT_SERVING while none serves), and stop closes the door and what the doors share."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.config import GatewayConfig
from gateway.lifecycle import SERVICE_NAME, GatewayLifecycle
from splitspec.net import free_port
from splitspec.telemetry.config import TelemetryConfig


async def health_status(address: str) -> int | None:
    """The gateway service's status; None while it has none yet (NOT_FOUND)."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return None
    return reply.status


def test_start_opens_the_grpc_door_following_the_verifiers_and_stop_closes_it():
    config = GatewayConfig(grpc_port=free_port(), verifier=(f"127.0.0.1:{free_port()}",),
                           health_interval_s=0.05, stats_interval_ms=50)
    address = f"127.0.0.1:{config.grpc_port}"

    async def run() -> None:
        gateway = GatewayLifecycle(config, TelemetryConfig(metrics_port=0))
        await gateway.start()
        try:
            # no status until the follower has looked; nothing listens at the verifier's
            # address, so it says NOT_SERVING
            for _ in range(100):
                if await health_status(address) == health_pb2.HealthCheckResponse.NOT_SERVING:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the gRPC health status never followed the verifiers")
            assert gateway.rest_app().routes  # the REST door's app, on the same frontend
        finally:
            await gateway.stop()
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await health_status(address)
        assert gone.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(run())
