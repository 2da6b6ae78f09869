"""Entry point of a proposer process: `splitspec-proposer --method ngram --port 50052`."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Sequence

from proposer_service.base import Proposer
from proposer_service.config import ProposerConfig
from proposer_service.ngram import NgramProposer
from proposer_service.servicer import ProposerServicer
from splitspec.config import parse_config
from splitspec.grpc_server import (add_health_and_reflection, make_server, mark_serving,
                                   setup_logging)
from protos import proposer_pb2, proposer_pb2_grpc

log = logging.getLogger("splitspec.proposer")
SERVICE_NAME = proposer_pb2.DESCRIPTOR.services_by_name["Proposer"].full_name


def build_proposer(config: ProposerConfig) -> Proposer:
    if config.method == "ngram":
        return NgramProposer(config.ngram_min, config.ngram_max,
                             config.max_num_speculative_tokens, config.idle_timeout_s)
    raise ValueError(f"unknown proposer method {config.method!r}")


async def serve(config: ProposerConfig) -> None:
    proposer = build_proposer(config)
    server = make_server()
    proposer_pb2_grpc.add_ProposerServicer_to_server(ProposerServicer(proposer), server)
    health = add_health_and_reflection(server, [SERVICE_NAME])
    address = f"{config.host}:{config.port}"
    server.add_insecure_port(address)
    await server.start()
    await mark_serving(health, [SERVICE_NAME])
    log.info("proposer %s serving on %s", config.method, address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=2.0)


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_config(ProposerConfig, argv)
    setup_logging(config.log_level)
    asyncio.run(serve(config))


if __name__ == "__main__":
    main()
