"""A stack with several verifier replicas behind one gateway, and streams held in flight while a
test does something to a replica (kills it, drains it)."""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
from learned_testlib import GenClient, Result
from polling import wait_until
from stats_testlib import current, idle, watch_until

from protos import common_pb2, verifier_pb2, verifier_pb2_grpc
from splitspec.launcher import Service, Stack


@dataclass
class InFlight:
    """Streams started together; `ready` is set once every one has `min_tokens` tokens."""

    reqs: list[common_pb2.GenerateRequest]
    min_tokens: int
    counts: list[int] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.reqs)

    def on_chunk(self, i: int):
        def seen(n: int) -> None:
            with self.lock:
                self.counts[i] = n
                if min(self.counts) >= self.min_tokens:
                    self.ready.set()
        return seen


def run_in_flight(client: GenClient, reqs: list[common_pb2.GenerateRequest], min_tokens: int,
                  while_streaming, timeout: float = 120.0) -> list[Result | grpc.RpcError]:
    """Start every request, call while_streaming() once each has min_tokens tokens, and return
    each one's result or error. On a loaded machine a request that started early may already
    have finished by then (another one was slow to start): callers count what is running from
    the verifiers' stats, not from len(reqs)."""
    flight = InFlight(reqs, min_tokens)

    def one(i: int):
        try:
            return client.generate(reqs[i], timeout, flight.on_chunk(i))
        except grpc.RpcError as exc:
            return exc

    with ThreadPoolExecutor(len(reqs)) as pool:
        futures = [pool.submit(one, i) for i in range(len(reqs))]
        assert flight.ready.wait(timeout), f"streams did not all start: {flight.counts}"
        while_streaming()
        return [f.result() for f in futures]


def kill(svc: Service) -> None:
    os.killpg(svc.proc.pid, signal.SIGKILL)
    svc.proc.wait()


def busy_replicas(stack: Stack) -> list[Service]:
    return [v for v in stack.verifiers if current(v.port).running]


def ensure_all_serving(stack: Stack, client: GenClient) -> None:
    """Every replica up (restarted if a test left it dead), routed to by the gateway (tiny
    requests until each replica has served one: the gateway has seen it SERVING), and idle
    with all blocks free."""
    for v in stack.verifiers:
        if not v.alive():
            stack.restart(v)
    before = {v.name: watch_until(v.port, idle).finished_requests for v in stack.verifiers}

    def every_replica_served() -> bool:
        if all(current(v.port).finished_requests > before[v.name] for v in stack.verifiers):
            return True
        client.generate(client.request("x", None, max_tokens=1))
        return False

    # by time, not by a count of requests: a restarted replica needs its start and the gateway's
    # health watch to see it, however fast the requests meanwhile are
    wait_until(every_replica_served, 60, 0.05, "the gateway to route to every replica")
    for v in stack.verifiers:
        watch_until(v.port, idle)


class StatsFollower:
    """The last stats a verifier reported before its WatchStats stream ended (it exited)."""

    def __init__(self, port: int, interval_ms: int = 20):
        self.first: verifier_pb2.EngineStats | None = None
        self.last: verifier_pb2.EngineStats | None = None
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self._call = verifier_pb2_grpc.VerifierStub(self._channel).WatchStats(
            verifier_pb2.WatchStatsRequest(interval_ms=interval_ms))
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()
        wait_until(lambda: self.last is not None or not self._thread.is_alive(), 30, 0.01,
                   "the verifier's first stats")

    def _follow(self) -> None:
        try:
            for stats in self._call:
                self.first = self.first or stats
                self.last = stats
        except grpc.RpcError:
            pass

    def ended(self, timeout: float) -> verifier_pb2.EngineStats:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the verifier's stats stream did not end"
        self._channel.close()
        return self.last
