"""Entry point of the verifier process: `splitspec-verifier --model models/target
--proposer ngram=127.0.0.1:50052`.

Each `--proposer METHOD=TARGET` becomes a `ProposerPool` over every address TARGET resolves to
(one, for a plain HOST:PORT); see verifier_service/drafts/pool.py."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Sequence

import grpc
import torch

from protos import verifier_pb2, verifier_pb2_grpc
from splitspec.chat_templates import load_chat_template
from splitspec.device import trim_host_heap
from splitspec.grpc_server import (
    add_health_and_reflection,
    listen,
    make_server,
    mark_not_serving,
    mark_serving,
)
from splitspec.lifecycle import run_service, until_stopped
from splitspec.modelio import load_tokenizer, model_name, tokenizer_fingerprint
from splitspec.telemetry.config import VERIFIER_METRICS_PORT, TelemetryConfig
from splitspec.tensor_parallel import RankLost, TPGroup
from splitspec.tls import client_tls, server_tls
from splitspec.tp_ranks import exit_now
from verifier_service.config import VerifierConfig
from verifier_service.config_check import check_config
from verifier_service.drafts.addresses import split_target
from verifier_service.drafts.client import GrpcProposerClient, ProposerClient, ProposerMismatch
from verifier_service.drafts.pool import ProposerPool
from verifier_service.engine import Engine
from verifier_service.model.memory import report_graphs
from verifier_service.model.target import build_runner
from verifier_service.servicer import VerifierServicer
from verifier_service.step.warmup import warm_up
from verifier_service.telemetry.service import SERVICE_NAME as TELEMETRY_NAME
from verifier_service.telemetry.service import VerifierTelemetry
from verifier_service.tp.broadcast import PlanBroadcast
from verifier_service.tp.worker import serve_node, start_group

log = logging.getLogger("splitspec.verifier")
SERVICE_NAME = verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name


def parse_proposers(specs: Sequence[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        method, sep, address = spec.partition("=")
        if not sep or not address:
            raise SystemExit(f"--proposer expects METHOD=HOST:PORT, got {spec!r}")
        try:
            split_target(address)
        except ValueError as exc:
            raise SystemExit(f"--proposer {spec!r}: {exc}") from None
        out[method] = address
    return out


def proposer_pools(config: VerifierConfig, vocab_size: int,
                   fingerprint: str) -> dict[str, ProposerClient]:
    """One pool per method over every address its HOST:PORT resolves to (often just one); with
    TLS each member's certificate is checked for the name the address was found under."""
    tls = client_tls(config, "verifier to proposers")

    def member_factory(method: str):
        return lambda address, host: GrpcProposerClient(
            method, address, vocab_size, fingerprint, config.proposer_reconnect_s, tls, host)

    return {m: ProposerPool(m, target, member_factory(m), config.proposer_resolve_interval_s)
            for m, target in parse_proposers(config.proposer).items()}


def eos_ids(tokenizer, model) -> set[int]:
    ids = set()
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    for v in (tokenizer.eos_token_id, gen_eos):
        if isinstance(v, int):
            ids.add(v)
        elif v:
            ids.update(v)
    return ids


def build_engine(config: VerifierConfig, proposers: dict[str, ProposerClient] | None = None,
                 observers: Sequence = (), group: TPGroup | None = None):
    """Load the target and tokenizer; returns (engine, fingerprint, device, dtype). With a
    tensor-parallel group this is rank 0: each step's plan is broadcast to the other ranks."""
    if config.seed >= 0:
        torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(config.model, config.trust_remote_code, config.load_format)
    runner, model, dtype = build_runner(config, group)
    fingerprint = tokenizer_fingerprint(tokenizer)
    if proposers is None:
        proposers = proposer_pools(config, runner.vocab_size, fingerprint)
    engine = Engine(config, runner, tokenizer, proposers, eos_ids(tokenizer, model),
                    runner.max_model_len, observers=observers)
    if group is not None and group.size > 1:
        engine.executor.broadcast = PlanBroadcast(group, runner.kv)
    trim_host_heap()  # the load's temporaries and the released float32 copies, out of RSS
    return engine, fingerprint, runner.device, dtype


class _RankLoss:
    """Rank 0's answer to another tensor-parallel rank exiting: while starting, exit at once
    (nothing to fail); once serving, `event` is set: every request in flight fails with
    UNAVAILABLE and the verifier exits non-zero, for its supervisor to restart the group."""

    def __init__(self):
        self.loop: asyncio.AbstractEventLoop | None = None
        self.event = asyncio.Event()
        self.why = ""

    def __call__(self, rank: int, code: int | None) -> None:  # a watcher thread
        self.why = f"tensor-parallel rank {rank} exited with code {code}"
        if self.loop is None:
            exit_now(1, f"verifier: {self.why} while starting")
        self.loop.call_soon_threadsafe(self.event.set)


async def _until_stopped_or(event: asyncio.Event) -> None:
    stop = asyncio.ensure_future(until_stopped())
    lost = asyncio.ensure_future(event.wait())
    await asyncio.wait({stop, lost}, return_when=asyncio.FIRST_COMPLETED)
    for task in (stop, lost):
        task.cancel()


async def serve(config: VerifierConfig, telemetry_config: TelemetryConfig | None = None) -> None:
    check_config(config)  # an inconsistent configuration is refused before the model loads
    try:
        chat_template = (load_chat_template(config.chat_template) if config.chat_template
                         else None)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if config.tensor_parallel_node_rank > 0:  # a host of further ranks: no gRPC here
        sys.exit(await asyncio.to_thread(serve_node, config))
    tls = server_tls(config, "verifier")  # and certificates that cannot serve
    # metrics and spans observe the engine; tracing interceptors must exist before any channel
    telemetry = VerifierTelemetry(config.host, config.served_model_name or model_name(config.model),
                                  telemetry_config)
    started = time.perf_counter()
    loss, group, ranks = _RankLoss(), None, None
    if config.tensor_parallel_size > 1 or config.tensor_parallel_nodes > 1:
        try:
            group, ranks = start_group(config, loss)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
    engine, fingerprint, device, dtype = build_engine(config, observers=telemetry.observers,
                                                      group=group)
    loaded = time.perf_counter() - started
    telemetry.bind(engine)
    for client in engine.proposers.values():
        # Refuses an incompatible proposer now; one that is not up yet is retried per step.
        try:
            await client.connect()
        except ProposerMismatch as exc:
            raise SystemExit(f"error: {exc}") from None
        except (grpc.aio.AioRpcError, asyncio.TimeoutError, OSError):
            log.warning("%s proposer at %s not reachable yet; will retry", client.method,
                        client.address)
    engine.start()
    if config.warmup:
        await warm_up(engine)
        report_graphs(engine.runner.memory_budget, engine.executor.stats.graph_pool_bytes)
    server = make_server(tls)
    name = config.served_model_name or model_name(config.model)
    verifier_pb2_grpc.add_VerifierServicer_to_server(
        VerifierServicer(engine, name, fingerprint, str(device), str(dtype).removeprefix("torch."),
                         tracer=telemetry.tracer, chat_template=chat_template),
        server)
    health = add_health_and_reflection(server, [SERVICE_NAME])
    address = f"{config.host}:{config.port}"
    listen(server, address, tls)
    await server.start()
    await mark_serving(health, [SERVICE_NAME])
    telemetry.start()
    kv = engine.runner.kv
    log.info("verifier serving %s on %s%s (%s, %s%s, %d torch threads); KV cache: %d blocks of "
             "%d tokens; ready in %.1f s (model %.1f s)", name, address, " (TLS)" if tls else "",
             device, dtype, f", tensor parallel over {group.size} ranks" if group else "",
             torch.get_num_threads(), kv.num_blocks, kv.block_size,
             time.perf_counter() - started, loaded)
    loss.loop = asyncio.get_running_loop()
    await _until_stopped_or(loss.event)
    if loss.event.is_set():
        await mark_not_serving(health, [SERVICE_NAME])
        failed = engine.fail_all(RankLost(f"verifier: {loss.why}; the request was not "
                                          "finished"))
        await server.stop(grace=1.0)
        exit_now(1, f"verifier: {loss.why}: {failed} requests failed; exiting")
    # Drain: health NOT_SERVING first (gateways watching it stop routing here), then new calls
    # are refused with UNAVAILABLE (a gateway retries them elsewhere), the requests in flight
    # get the grace period, and what is still running just before it ends is failed with
    # UNAVAILABLE (a gateway resumes it on another replica) while its status can still go out.
    await mark_not_serving(health, [SERVICE_NAME])
    grace = config.shutdown_grace_s
    handback = min(0.5, grace / 4)
    log.info("draining: %d requests in flight, up to %.1f s", engine.num_in_flight, grace)
    stopping = asyncio.ensure_future(server.stop(grace=config.shutdown_grace_s))
    cut = await engine.drain(grace - handback)
    if cut:
        log.warning("grace period over: %d requests handed back unfinished", cut)
    await server.stop(grace=handback)  # sooner: nothing left but streams such as WatchStats
    await stopping
    if group is not None:  # the other ranks stop after the last step
        await engine.on_model_thread(engine.executor.broadcast.stop)
    await engine.shutdown()
    if group is not None:
        ranks.stop()
        group.close()
    for client in engine.proposers.values():
        await client.close()
    telemetry.close()


def main(argv: Sequence[str] | None = None) -> None:
    run_service(VerifierConfig, argv, VERIFIER_METRICS_PORT, serve, lambda _: TELEMETRY_NAME)


if __name__ == "__main__":
    main()
