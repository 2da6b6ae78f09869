"""The gateway's lifecycle, one for both front doors (REST and gRPC).

What the doors share is built here once: the verifier pool, telemetry, the speculation policy
with the stats watcher that feeds its estimates from the verifiers' WatchStats streams, the API
keys and the per-key concurrency limit (one count for both doors). `start` starts them and the
gRPC door, whose health status follows the verifiers' as REST /health does; `stop` undoes it in
reverse once the REST door has finished its requests: the gRPC door gets a grace period for the
generations in flight, then the stats watcher, the pool and telemetry close.
"""

from __future__ import annotations

import asyncio

import grpc
from starlette.applications import Starlette

from gateway.auth import ApiKeys
from gateway.config import GatewayConfig
from gateway.estimates import Estimates
from gateway.frontend import Frontend
from gateway.grpc_api import GenerationServicer
from gateway.limits import ConcurrencyLimit
from gateway.policy import PolicyConfig, SpeculationPolicy
from gateway.rest import RestLimits, build_app
from gateway.stats_watch import StatsWatcher
from gateway.telemetry import GatewayTelemetry
from gateway.verifier_pool import VerifierPool
from protos import generation_pb2, generation_pb2_grpc
from splitspec import grpc_server
from splitspec.telemetry.config import TelemetryConfig
from splitspec.tls import client_tls, server_tls

SERVICE_NAME = generation_pb2.DESCRIPTOR.services_by_name["Generation"].full_name
GRPC_STOP_GRACE_S = 2.0  # for the gRPC door's generations in flight at a stop


class GatewayLifecycle:
    def __init__(self, config: GatewayConfig, telemetry_config: TelemetryConfig | None = None):
        self.config = config
        # TLS: the front doors' (the REST door's HTTPS too) and the one to the verifiers
        self.front_tls = server_tls(config, "gateway front doors", config.tls_front_door_ca)
        self.pool = VerifierPool(config.verifier, config.info_ttl_s, config.max_pending,
                                 config.resume_wait_s, client_tls(config, "gateway to verifiers"),
                                 config.prefix_routing_config())
        self.telemetry = GatewayTelemetry(config.host, self.pool, telemetry_config)
        estimates = Estimates()
        policy = SpeculationPolicy(estimates,
                                   PolicyConfig(config.speculative_disable_queue_size))
        self.frontend = Frontend(self.pool, policy, self.telemetry.metrics,
                                 self.telemetry.tracer)
        self._stats = StatsWatcher(self.pool, estimates, config.stats_interval_ms)
        self.keys = ApiKeys.load(config.api_key_file)
        self.concurrency = ConcurrencyLimit(config.max_concurrent_per_key)
        self._grpc: grpc.aio.Server | None = None
        self._health_task: asyncio.Task | None = None

    def rest_app(self) -> Starlette:
        """The REST door's application, on the shared frontend, keys and concurrency limit."""
        c = self.config
        limits = RestLimits(c.max_body_bytes, c.body_timeout_s, self.keys, self.concurrency)
        return build_app(self.frontend, c.max_prompts, limits, c.auto_tool_parser())

    async def start(self) -> None:
        """Watch the verifiers' stats, open the gRPC door, serve /metrics."""
        self._stats.start()
        self._grpc = grpc_server.make_server(self.front_tls)
        generation_pb2_grpc.add_GenerationServicer_to_server(
            GenerationServicer(self.frontend, self.keys, self.concurrency), self._grpc)
        health = grpc_server.add_health_and_reflection(self._grpc, [SERVICE_NAME])
        grpc_server.listen(self._grpc, f"{self.config.host}:{self.config.grpc_port}",
                           self.front_tls)
        await self._grpc.start()
        self._health_task = asyncio.create_task(self._follow_health(health))
        self.telemetry.start()

    async def stop(self) -> None:
        """After the REST door has stopped: close the gRPC door and what the doors share."""
        if self._health_task is not None:
            self._health_task.cancel()
        if self._grpc is not None:
            await self._grpc.stop(grace=GRPC_STOP_GRACE_S)
        await self._stats.close()
        await self.pool.close()
        self.telemetry.close()

    async def _follow_health(self, health) -> None:
        """The gRPC health status: SERVING while a verifier is, NOT_SERVING otherwise."""
        serving = None
        while True:
            ok = await self.pool.healthy()
            if ok != serving:
                mark = grpc_server.mark_serving if ok else grpc_server.mark_not_serving
                await mark(health, [SERVICE_NAME])
                serving = ok
            await asyncio.sleep(self.config.health_interval_s)
