"""Entry point of a proposer process: `splitspec-proposer --method ngram --port 50052`, or
`--method draft --model models/draft` / `--method mlp --model models/mlp-speculator`, each with its
own `--device` and `--dtype`."""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
from typing import Sequence

from proposer_service.base import Proposer
from proposer_service.config import ProposerConfig
from proposer_service.servicer import ProposerServicer
from proposer_service.telemetry import ProposerTelemetry, service_name
from protos import proposer_pb2, proposer_pb2_grpc
from splitspec.grpc_server import (
    add_health_and_reflection,
    make_server,
    mark_serving,
    setup_logging,
)
from splitspec.lifecycle import exit_with_launcher
from splitspec.methods import METHODS
from splitspec.telemetry.config import PROPOSER_METRICS_PORT, TelemetryConfig, parse_service_config
from splitspec.telemetry.tracing import setup_tracing, shutdown_tracing

log = logging.getLogger("splitspec.proposer")
SERVICE_NAME = proposer_pb2.DESCRIPTOR.services_by_name["Proposer"].full_name


def proposer_class(method: str) -> type[Proposer]:
    """The implementation the registry names for `method`."""
    module, _, name = METHODS[method].implementation.partition(":")
    return getattr(importlib.import_module(module), name)


def build_proposer(config: ProposerConfig) -> Proposer:
    return proposer_class(config.method).from_config(config)


async def serve(config: ProposerConfig, telemetry_config: TelemetryConfig | None = None) -> None:
    proposer = build_proposer(config)
    telemetry = ProposerTelemetry(config.method, config.host, telemetry_config)
    server = make_server()
    proposer_pb2_grpc.add_ProposerServicer_to_server(
        ProposerServicer(proposer, telemetry.metrics, telemetry.tracer), server)
    health = add_health_and_reflection(server, [SERVICE_NAME])
    address = f"{config.host}:{config.port}"
    server.add_insecure_port(address)
    await server.start()
    await mark_serving(health, [SERVICE_NAME])
    desc = proposer.describe()
    log.info("proposer %s (%s) serving on %s", config.method, desc.model or "-", address)
    telemetry.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=2.0)
    telemetry.close()


def main(argv: Sequence[str] | None = None) -> None:
    exit_with_launcher()
    config, telemetry_config = parse_service_config(ProposerConfig, argv, PROPOSER_METRICS_PORT)
    setup_logging(config.log_level)
    setup_tracing(service_name(config.method))
    try:
        asyncio.run(serve(config, telemetry_config))
    finally:
        shutdown_tracing()


if __name__ == "__main__":
    main()
