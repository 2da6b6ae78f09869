"""Entry point of a proposer process: `splitspec-proposer --method ngram --port 50052`, or
`--method draft --model models/draft` / `--method mlp --model models/mlp-speculator`, each with its
own `--device` and `--dtype`."""

from __future__ import annotations

import importlib
import logging
import sys
import time
from typing import Sequence

from proposer_service.base import Proposer
from proposer_service.config import ProposerConfig
from proposer_service.servicer import ProposerServicer
from proposer_service.telemetry.service import ProposerTelemetry, service_name
from protos import proposer_pb2, proposer_pb2_grpc
from splitspec.device import trim_host_heap
from splitspec.grpc_server import add_health_and_reflection, listen, make_server, mark_serving
from splitspec.lifecycle import run_service, until_stopped
from splitspec.methods import METHODS
from splitspec.telemetry.config import PROPOSER_METRICS_PORT, TelemetryConfig
from splitspec.tls import server_tls

log = logging.getLogger("splitspec.proposer")
SERVICE_NAME = proposer_pb2.DESCRIPTOR.services_by_name["Proposer"].full_name


def proposer_class(method: str) -> type[Proposer]:
    """The implementation the registry names for `method`."""
    module, _, name = METHODS[method].implementation.partition(":")
    return getattr(importlib.import_module(module), name)


def build_proposer(config: ProposerConfig) -> Proposer:
    if config.tensor_parallel_size > 1:  # the draft split over devices: this is rank 0
        from proposer_service.draft.tp import start

        return start(config)
    return proposer_class(config.method).from_config(config)


def threads_note() -> str:
    """'; N torch threads' for a proposer that loaded torch (a model's); nothing otherwise."""
    torch = sys.modules.get("torch")
    return f"; {torch.get_num_threads()} torch threads" if torch is not None else ""


async def serve(config: ProposerConfig, telemetry_config: TelemetryConfig | None = None) -> None:
    proposer = build_proposer(config)
    trim_host_heap()  # the load's temporaries, out of RSS
    started = time.perf_counter()
    proposer.warm_up()
    log.info("warm-up took %.2f s", time.perf_counter() - started)
    telemetry = ProposerTelemetry(config.method, config.host, telemetry_config)
    tls = server_tls(config, f"proposer {config.method}")
    server = make_server(tls)
    proposer_pb2_grpc.add_ProposerServicer_to_server(
        ProposerServicer(proposer, telemetry.metrics, telemetry.tracer), server)
    health = add_health_and_reflection(server, [SERVICE_NAME])
    address = f"{config.host}:{config.port}"
    listen(server, address, tls)
    await server.start()
    await mark_serving(health, [SERVICE_NAME])
    desc = proposer.describe()
    log.info("proposer %s (%s) serving on %s%s%s", config.method, desc.model or "-", address,
             " (TLS)" if tls else "", threads_note())
    telemetry.start()
    await until_stopped()
    await server.stop(grace=2.0)
    if hasattr(proposer, "stop"):  # tensor parallel: the other ranks exit too
        proposer.stop()
    telemetry.close()


# Drafting ahead runs in a worker thread; the event loop must still read the next step's message
# and answer a hit at once, so it gets the interpreter lock back sooner than the default 5 ms.
GIL_SWITCH_INTERVAL_S = 0.0005


def main(argv: Sequence[str] | None = None) -> None:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    run_service(ProposerConfig, argv, PROPOSER_METRICS_PORT, serve,
                lambda config: service_name(config.method))


if __name__ == "__main__":
    main()
