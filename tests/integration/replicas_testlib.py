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
from stats_testlib import current, idle, watch_until

from protos import common_pb2
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
    """Start every request, call while_streaming() once each has min_tokens tokens (none can
    have finished: max_tokens must be larger), and return each one's result or error."""
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


def ensure_all_serving(stack: Stack) -> None:
    """Every replica up (restarted if a test left it dead) and idle with all blocks free."""
    for v in stack.verifiers:
        if not v.alive():
            stack.restart(v)
        watch_until(v.port, idle)
