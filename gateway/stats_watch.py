"""Following every verifier replica's Verifier/WatchStats stream in the background and handing
each snapshot to the policy's estimates (gateway/estimates.py). A broken stream is opened again
after a short pause; a replica that never answers simply leaves the policy on its priors."""

from __future__ import annotations

import asyncio
import logging

import grpc

from gateway.estimates import Estimates, MethodSnapshot, ReplicaSnapshot
from gateway.verifier_pool import Replica, VerifierPool
from protos import verifier_pb2
from splitspec.goodput import Acceptance

log = logging.getLogger(__name__)

RETRY_S = 1.0


def snapshot_from_pb(pb: verifier_pb2.EngineStats) -> ReplicaSnapshot:
    return ReplicaSnapshot(
        running=pb.running, waiting=pb.waiting, max_num_seqs=pb.max_num_seqs, steps=pb.steps,
        methods={m.method: MethodSnapshot(
            Acceptance.from_counters(m.greedy), Acceptance.from_counters(m.sampled),
            tuple((b.k, float(b.calls), b.seconds_total) for b in m.round_trips),
            longest_draft=m.longest_draft,
            trees=tuple((t.branches, Acceptance.from_counters(t.greedy),
                         Acceptance.from_counters(t.sampled)) for t in m.trees),
            round_trips_by_seqs=tuple((b.k, b.max_seqs, float(b.calls), b.seconds_total)
                                      for b in m.round_trips_by_seqs),
            unavailable=m.unavailable)
            for m in pb.methods},
        step_cost=tuple((b.kind or "greedy", b.steps, float(b.tokens_total), b.seconds_total)
                        for b in pb.step_cost),
        step_cost_by_seqs=tuple((b.kind or "greedy", b.max_seqs, b.steps, float(b.tokens_total),
                                 b.seconds_total) for b in pb.step_cost_by_seqs),
        step_cost_by_method=tuple((b.method, b.kind or "greedy", b.max_seqs, b.steps,
                                   float(b.tokens_total), b.seconds_total)
                                  for b in pb.step_cost_by_method))


class StatsWatcher:
    def __init__(self, pool: VerifierPool, estimates: Estimates, interval_ms: int = 500):
        self.pool = pool
        self.estimates = estimates
        self.interval_ms = interval_ms
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._watch(r), name=f"stats-{r.address}")
                       for r in self.pool.replicas]

    async def _watch(self, replica: Replica) -> None:
        request = verifier_pb2.WatchStatsRequest(interval_ms=self.interval_ms)
        while True:
            try:
                async for pb in replica.stub.WatchStats(request):
                    self.estimates.observe(replica.address, snapshot_from_pb(pb),
                                           replica.in_flight)
            except grpc.aio.AioRpcError as exc:
                log.debug("stats of %s: %s", replica.address, exc.code().name)
            except Exception:  # noqa: BLE001 - the policy falls back on what it knows
                log.exception("stats of %s could not be used", replica.address)
            await asyncio.sleep(RETRY_S)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
