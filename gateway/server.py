"""Entry point of the gateway: REST on --http-port and gRPC on --grpc-port, one event loop;
Prometheus metrics on --metrics-port."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Sequence

import uvicorn

from gateway.config import GatewayConfig
from gateway.frontend import Frontend
from gateway.grpc_api import GenerationServicer
from gateway.policy import SpeculationPolicy
from gateway.rest import build_app
from gateway.telemetry import SERVICE_NAME as TELEMETRY_NAME
from gateway.telemetry import GatewayTelemetry
from gateway.verifier_pool import VerifierPool
from protos import generation_pb2, generation_pb2_grpc
from splitspec.grpc_server import (
    add_health_and_reflection,
    listen,
    make_server,
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
    frontend = Frontend(pool, SpeculationPolicy(), telemetry.metrics, telemetry.tracer)
    grpc_server = make_server()
    generation_pb2_grpc.add_GenerationServicer_to_server(GenerationServicer(frontend),
                                                         grpc_server)
    health = add_health_and_reflection(grpc_server, [SERVICE_NAME])
    listen(grpc_server, f"{config.host}:{config.grpc_port}")
    await grpc_server.start()
    await mark_serving(health, [SERVICE_NAME])
    telemetry.start()

    http = uvicorn.Server(uvicorn.Config(build_app(frontend, config.max_prompts),
                                         host=config.host, port=config.http_port,
                                         log_level=config.log_level.lower(), access_log=False))
    http.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # ours below
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: setattr(http, "should_exit", True))
    log.info("gateway: REST http://%s:%d, gRPC %s:%d, verifiers %s", config.host,
             config.http_port, config.host, config.grpc_port, ", ".join(config.verifier))
    await http.serve()
    await grpc_server.stop(grace=2.0)
    await pool.close()
    telemetry.close()


def main(argv: Sequence[str] | None = None) -> None:
    run_service(GatewayConfig, argv, GATEWAY_METRICS_PORT, serve, lambda _: TELEMETRY_NAME)


if __name__ == "__main__":
    main()
