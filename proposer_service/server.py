"""Entry point of a proposer process: `splitspec-proposer --method ngram --port 50052`, or
`--method draft --model models/draft` / `--method mlp --model models/mlp-speculator`, each with its
own `--device` and `--dtype`."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Sequence

import torch

from proposer_service.base import Proposer
from proposer_service.config import ProposerConfig
from proposer_service.draft import DraftModelProposer
from proposer_service.mlp import MlpSpeculatorProposer
from proposer_service.ngram import NgramProposer
from proposer_service.servicer import ProposerServicer
from splitspec.config import parse_config
from splitspec.lifecycle import exit_with_launcher
from splitspec.device import resolve_device, resolve_dtype
from splitspec.grpc_server import (add_health_and_reflection, make_server, mark_serving,
                                   setup_logging)
from protos import proposer_pb2, proposer_pb2_grpc

log = logging.getLogger("splitspec.proposer")
SERVICE_NAME = proposer_pb2.DESCRIPTOR.services_by_name["Proposer"].full_name


def build_proposer(config: ProposerConfig) -> Proposer:
    if config.method == "ngram":
        return NgramProposer(config.ngram_min, config.ngram_max,
                             config.max_num_speculative_tokens, config.idle_timeout_s)
    if config.method in ("draft", "mlp"):
        if not config.model:
            raise SystemExit(f"error: --method {config.method} needs --model DIR")
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        device = resolve_device(config.device)
        cls = DraftModelProposer if config.method == "draft" else MlpSpeculatorProposer
        try:
            return cls.load(config.model, device, resolve_dtype(config.dtype, device),
                            tokenizer=config.tokenizer, trust_remote_code=config.trust_remote_code,
                            max_k=config.max_num_speculative_tokens,
                            draft_top_k=config.draft_top_k, max_batch=config.max_batch,
                            idle_timeout_s=config.idle_timeout_s)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"error: cannot load the {config.method} proposer: {exc}") from None
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
    desc = proposer.describe()
    log.info("proposer %s (%s) serving on %s", config.method, desc.model or "-", address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=2.0)


def main(argv: Sequence[str] | None = None) -> None:
    exit_with_launcher()
    config = parse_config(ProposerConfig, argv)
    setup_logging(config.log_level)
    asyncio.run(serve(config))


if __name__ == "__main__":
    main()
