"""Routing over verifier replicas: among the replicas whose health says SERVING (each one's
grpc.health Watch stream is followed, so a draining or dead replica gets no new requests), the
one that was recently sent the request's longest prefix when that is long enough and it is not
too busy (gateway/prefix_index.py), else the one with the fewest requests in flight; a stream
resumed on another replica when its own goes away mid-stream (gateway/resume.py), a bound on
requests in flight at the gateway, and a cached view of what the replicas serve (model,
proposers, limits). A replica seen not serving loses its prefix index: whatever comes back has
an empty cache."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.prefix_index import (
    FALLBACK,
    LEAST_LOAD,
    REASONS,
    Candidate,
    PrefixIndex,
    PrefixKey,
    PrefixRoutingConfig,
    request_key,
    route,
)
from gateway.resume import StreamProgress, resumable
from protos import common_pb2, verifier_pb2, verifier_pb2_grpc
from splitspec.errors import ResourceExhausted, Unavailable, from_rpc_error
from splitspec.grpc_server import Dialer
from splitspec.tls import ClientTls

log = logging.getLogger(__name__)

# Attempts per request: the first, then resumes after its replica went away.
MAX_ATTEMPTS = 8


@dataclass(eq=False)
class Replica:
    address: str
    tls: ClientTls | None = None
    in_flight: int = 0
    # What its health Watch said last; True until it says otherwise (a replica without a
    # health service is tried like any other).
    serving: bool = True
    watcher: asyncio.Task | None = None
    dialer: Dialer = field(init=False)
    _stub: tuple[grpc.aio.Channel, verifier_pb2_grpc.VerifierStub] | None = field(
        init=False, default=None)

    def __post_init__(self) -> None:
        # after a certificate rotation new calls go over a new channel; the health watch (a
        # stream that never ends by itself) is reopened on it
        self.dialer = Dialer(self.address, self.tls, on_redial=self._rewatch)

    @property
    def channel(self) -> grpc.aio.Channel:
        return self.dialer.channel()

    @property
    def stub(self) -> verifier_pb2_grpc.VerifierStub:
        channel = self.channel
        if self._stub is None or self._stub[0] is not channel:
            self._stub = (channel, verifier_pb2_grpc.VerifierStub(channel))
        return self._stub[1]

    def _rewatch(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
            self.watcher = None  # the pool starts it again on its next pick

    async def watch_health(self, retry_s: float = 0.2) -> None:
        """Follow the replica's health until cancelled; unreachable counts as not serving."""
        while True:
            try:
                stub = health_pb2_grpc.HealthStub(self.channel)
                async for resp in stub.Watch(health_pb2.HealthCheckRequest(service="")):
                    serving = resp.status == health_pb2.HealthCheckResponse.SERVING
                    if serving != self.serving:
                        log.info("verifier %s is %s", self.address,
                                 "serving" if serving else "not serving")
                    self.serving = serving
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    return  # no health service: keep trying it per request
            self.serving = False
            await asyncio.sleep(retry_s)


class VerifierPool:
    def __init__(self, addresses: tuple[str, ...], info_ttl_s: float = 5.0,
                 max_pending: int = 0, resume_wait_s: float = 0.0, tls: ClientTls | None = None,
                 prefix: PrefixRoutingConfig | None = None):
        if not addresses:
            raise ValueError("at least one verifier address is needed")
        self.replicas = [Replica(a, tls) for a in addresses]
        self.prefix = prefix or PrefixRoutingConfig()
        self.indexes = {r: PrefixIndex(self.prefix.max_blocks) for r in self.replicas}
        # counter: replicas chosen for a generation's attempts, by reason (prefix_index.REASONS)
        self.routing_decisions = dict.fromkeys(REASONS, 0)
        self.max_pending = max_pending  # 0: no bound
        self.pending = 0  # requests in flight through this pool
        # counter: continuations of a stream on another replica after its own went away
        self.resumed_streams = 0
        self.resume_wait_s = resume_wait_s
        self._rr = itertools.count()
        self._info: verifier_pb2.VerifierInfo | None = None
        self._info_at = -float("inf")
        self._info_ttl_s = info_ttl_s

    def _ordered(self) -> list[Replica]:
        """Serving replicas first, least loaded first; ties keep round-robin order."""
        self._watch()
        start = next(self._rr) % len(self.replicas)
        rotated = self.replicas[start:] + self.replicas[:start]
        return sorted(rotated, key=lambda r: (not r.serving, r.in_flight))

    def _watch(self) -> None:
        for replica in self.replicas:
            if replica.watcher is None:
                replica.watcher = asyncio.get_running_loop().create_task(
                    replica.watch_health(), name=f"health-watch-{replica.address}")

    async def _pick(self, failed: set[Replica], key: PrefixKey | None = None
                    ) -> Replica | None:
        """The next replica to try: one that has not failed this request yet (by prefix, else
        the least loaded), else (a stream to resume) one that failed but serves again, waiting
        up to resume_wait_s for it. The choice is counted by its reason; every try after the
        first counts as a fallback."""
        ordered = self._ordered()
        least = next((r for r in ordered if r not in failed), None)
        if least is not None:
            replica, reason = self._by_prefix(ordered, least, failed, key)
            self._count(FALLBACK if failed else reason)
            return replica
        deadline = time.monotonic() + self.resume_wait_s
        while True:
            serving = [r for r in self._ordered() if r.serving]
            if serving:
                self._count(FALLBACK)
                return serving[0]
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.1)

    def _by_prefix(self, ordered: list[Replica], least: Replica, failed: set[Replica],
                   key: PrefixKey | None) -> tuple[Replica, str]:
        if key is None or not self.prefix.enabled:
            return least, LEAST_LOAD
        candidates = [Candidate(self.indexes[r].match(key), r.in_flight,
                                r.serving and r not in failed) for r in ordered]
        i, reason = route(key, candidates, ordered.index(least), self.prefix)
        for r in ordered:  # its cache is gone, or going: what comes back starts empty
            if not r.serving:
                self.indexes[r].clear()
        return ordered[i], reason

    def _count(self, reason: str) -> None:
        self.routing_decisions[reason] += 1

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
        """Stream from the least-loaded serving replica. A replica that answers UNAVAILABLE
        (unreachable, draining, gone mid-stream) is left for another one; a stream that had
        already sent output continues there from that output (gateway/resume.py), so the
        client sees one stream. Leaving the iterator early cancels the verifier's request."""
        if self.max_pending and self.pending >= self.max_pending:
            raise ResourceExhausted(f"gateway: {self.pending} requests in flight (the most "
                                    "--max-pending allows); retry later")
        self.pending += 1
        try:
            async for msg in self._generate(request):
                yield msg
        finally:
            self.pending -= 1

    async def _generate(self, request: common_pb2.GenerateRequest
                        ) -> AsyncIterator[common_pb2.GenerateResponse]:
        progress = StreamProgress(request)
        failed: set[Replica] = set()
        first: grpc.aio.AioRpcError | None = None  # why the stream broke: the error to report
        last: grpc.aio.AioRpcError | None = None
        resuming = False  # output was sent and its replica went away: count the continuation
        key = request_key(request) if self.prefix.enabled else None
        text: list[str] = []  # the output so far, for the prefix index
        for _ in range(MAX_ATTEMPTS):
            replica = await self._pick(failed, key)
            if replica is None:
                break
            if key is not None:
                self.indexes[replica].insert(key)
            replica.in_flight += 1
            call = replica.stub.Generate(progress.next_request())
            try:
                async for msg in call:
                    if resuming:
                        self.resumed_streams += 1
                        resuming = False
                    if key is not None:
                        text.append(msg.text)
                    yield progress.observe(msg)
                if key is not None:  # what its cache holds now: the prompt and the answer
                    self.indexes[replica].insert(
                        request_key(request, progress.output_ids, "".join(text)))
                return
            except grpc.aio.AioRpcError as exc:
                if not resumable(exc, retrying=first is not None):
                    raise from_rpc_error(exc) from None
                first, last = first or exc, exc
                failed.add(replica)
                progress.resumes += 1
                if progress.output_ids:
                    resuming = True
                    log.warning("verifier %s went away mid-stream (%s: %s); resuming %s after "
                                "%d tokens", replica.address, exc.code().name, exc.details(),
                                request.request_id, len(progress.output_ids))
            finally:
                replica.in_flight -= 1
                call.cancel()
        # the first failure says why (a replica's own status, e.g. a lost tensor-parallel
        # rank); later tries of a replica that is gone only say that it refused to connect
        why = first.details() if first else "none"
        if last is not None and last is not first and last.details() != why:
            why += f" (then: {last.details()})"
        raise Unavailable(f"no verifier reachable: {why}")

    async def close(self) -> None:
        for replica in self.replicas:
            if replica.watcher is not None:
                replica.watcher.cancel()
            await replica.dialer.close()
