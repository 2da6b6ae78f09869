"""Entry point of the gateway: REST on --http-port and gRPC on --grpc-port, one event loop;
Prometheus metrics on --metrics-port. The gRPC health status follows the verifiers' as REST
/health does: SERVING while one of them is, NOT_SERVING otherwise."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Sequence

import uvicorn

from gateway.auth import ApiKeys
from gateway.config import GatewayConfig
from gateway.estimates import Estimates
from gateway.frontend import Frontend
from gateway.grpc_api import GenerationServicer
from gateway.http_server import timed_h11
from gateway.limits import ConcurrencyLimit
from gateway.policy import PolicyConfig, SpeculationPolicy
from gateway.rest import RestLimits, build_app
from gateway.stats_watch import StatsWatcher
from gateway.telemetry import SERVICE_NAME as TELEMETRY_NAME
from gateway.telemetry import GatewayTelemetry
from gateway.verifier_pool import VerifierPool
from protos import generation_pb2, generation_pb2_grpc
from splitspec.grpc_server import (
    add_health_and_reflection,
    listen,
    make_server,
    mark_not_serving,
    mark_serving,
)
from splitspec.lifecycle import run_service
from splitspec.telemetry.config import GATEWAY_METRICS_PORT, TelemetryConfig

log = logging.getLogger("splitspec.gateway")
SERVICE_NAME = generation_pb2.DESCRIPTOR.services_by_name["Generation"].full_name


async def serve(config: GatewayConfig, telemetry_config: TelemetryConfig | None = None) -> None:
    pool = VerifierPool(config.verifier, config.info_ttl_s, config.max_pending,
                        config.resume_wait_s)
    telemetry = GatewayTelemetry(config.host, pool, telemetry_config)
    estimates = Estimates()
    policy = SpeculationPolicy(estimates, PolicyConfig(config.speculative_disable_queue_size))
    frontend = Frontend(pool, policy, telemetry.metrics, telemetry.tracer)
    stats_watcher = StatsWatcher(pool, estimates, config.stats_interval_ms)
    stats_watcher.start()
    keys = ApiKeys.load(config.api_key_file)
    concurrency = ConcurrencyLimit(config.max_concurrent_per_key)  # one count for both doors
    grpc_server = make_server()
    generation_pb2_grpc.add_GenerationServicer_to_server(
        GenerationServicer(frontend, keys, concurrency), grpc_server)
    health = add_health_and_reflection(grpc_server, [SERVICE_NAME])
    listen(grpc_server, f"{config.host}:{config.grpc_port}")
    await grpc_server.start()
    watcher = asyncio.create_task(_follow_health(pool, health, config.health_interval_s))
    telemetry.start()

    limits = RestLimits(config.max_body_bytes, config.body_timeout_s, keys, concurrency)
    http = uvicorn.Server(uvicorn.Config(build_app(frontend, config.max_prompts, limits),
                                         host=config.host, port=config.http_port,
                                         http=timed_h11(config.header_timeout_s),
                                         log_level=config.log_level.lower(), access_log=False))
    http.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # ours below
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: setattr(http, "should_exit", True))
    log.info("gateway: REST http://%s:%d, gRPC %s:%d, verifiers %s", config.host,
             config.http_port, config.host, config.grpc_port, ", ".join(config.verifier))
    await http.serve()
    watcher.cancel()
    await grpc_server.stop(grace=2.0)
    await stats_watcher.close()
    await pool.close()
    telemetry.close()


async def _follow_health(pool: VerifierPool, health, interval_s: float) -> None:
    serving = None
    while True:
        ok = await pool.healthy()
        if ok != serving:
            await (mark_serving if ok else mark_not_serving)(health, [SERVICE_NAME])
            serving = ok
        await asyncio.sleep(interval_s)


def main(argv: Sequence[str] | None = None) -> None:
    run_service(GatewayConfig, argv, GATEWAY_METRICS_PORT, serve, lambda _: TELEMETRY_NAME)


if __name__ == "__main__":
    main()
