"""Routing over verifier replicas: least requests in flight first, failover before the first
token, and a cached view of what the replicas serve (model, proposers, limits)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import common_pb2, verifier_pb2, verifier_pb2_grpc
from splitspec.errors import Unavailable, from_rpc_error
from splitspec.grpc_server import insecure_channel


@dataclass(eq=False)
class Replica:
    address: str
    channel: grpc.aio.Channel = field(init=False)
    stub: verifier_pb2_grpc.VerifierStub = field(init=False)
    in_flight: int = 0

    def __post_init__(self) -> None:
        self.channel = insecure_channel(self.address)
        self.stub = verifier_pb2_grpc.VerifierStub(self.channel)


class VerifierPool:
    def __init__(self, addresses: tuple[str, ...], info_ttl_s: float = 5.0):
        if not addresses:
            raise ValueError("at least one verifier address is needed")
        self.replicas = [Replica(a) for a in addresses]
        self._rr = itertools.count()
        self._info: verifier_pb2.VerifierInfo | None = None
        self._info_at = -float("inf")
        self._info_ttl_s = info_ttl_s

    def _ordered(self) -> list[Replica]:
        start = next(self._rr) % len(self.replicas)
        rotated = self.replicas[start:] + self.replicas[:start]
        return sorted(rotated, key=lambda r: r.in_flight)  # stable: ties keep round-robin order

    async def info(self) -> verifier_pb2.VerifierInfo:
        if self._info is not None and time.monotonic() - self._info_at < self._info_ttl_s:
            return self._info
        last: grpc.aio.AioRpcError | None = None
        for replica in self._ordered():
            try:
                self._info = await replica.stub.Info(common_pb2.Empty(), timeout=5.0)
                self._info_at = time.monotonic()
                return self._info
            except grpc.aio.AioRpcError as exc:
                last = exc
        if self._info is not None:
            return self._info  # stale beats nothing; generate() reports real unavailability
        raise Unavailable(f"no verifier reachable: {last.details() if last else 'none'}")

    async def healthy(self) -> bool:
        for replica in self.replicas:
            try:
                resp = await health_pb2_grpc.HealthStub(replica.channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=2.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.aio.AioRpcError:
                continue
        return False

    async def generate(self, request: common_pb2.GenerateRequest
                       ) -> AsyncIterator[common_pb2.GenerateResponse]:
        """Stream from the least-loaded replica; an unreachable one is skipped as long as no
        token has been sent. Leaving the iterator early cancels the verifier's request."""
        last: grpc.aio.AioRpcError | None = None
        for replica in self._ordered():
            started = False
            replica.in_flight += 1
            call = replica.stub.Generate(request)
            try:
                async for msg in call:
                    started = True
                    yield msg
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE and not started:
                    last = exc
                    continue
                raise from_rpc_error(exc) from None
            finally:
                replica.in_flight -= 1
                call.cancel()
        raise Unavailable(f"no verifier reachable: {last.details() if last else 'none'}")

    async def close(self) -> None:
        for replica in self.replicas:
            await replica.channel.close()
