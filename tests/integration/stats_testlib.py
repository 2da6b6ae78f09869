"""Reading a verifier's counters the way operators do: its Verifier/WatchStats stream.

Tests poll the stream with a deadline instead of sleeping: `watch_until(port, idle)` returns as
soon as the verifier has nothing in flight and every KV block is free again.
"""

from __future__ import annotations

import grpc
from polling import wait_until

from protos import verifier_pb2, verifier_pb2_grpc

STREAM_S = 5.0  # one WatchStats stream's length; a longer wait opens the next


def watch_until(port: int, predicate, timeout: float = 30.0, interval_ms: int = 50
                ) -> verifier_pb2.EngineStats:
    """Follow WatchStats until predicate(stats) holds and return those stats; AssertionError
    with the last stats seen when it does not within timeout seconds (give or take one stream's
    STREAM_S)."""
    last: list[verifier_pb2.EngineStats] = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = verifier_pb2_grpc.VerifierStub(ch)

        def follow() -> verifier_pb2.EngineStats | None:
            """One stream (it sends the current stats at once): the first that satisfy
            predicate, or None when it ended first."""
            stream = stub.WatchStats(verifier_pb2.WatchStatsRequest(interval_ms=interval_ms),
                                     timeout=min(timeout, STREAM_S))
            try:
                for stats in stream:
                    last[:] = [stats]
                    if predicate(stats):
                        return stats
            except grpc.RpcError as exc:
                # its time is up, or a verifier still starting: ask again
                if exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                      grpc.StatusCode.UNAVAILABLE):
                    raise
            finally:
                stream.cancel()
            return None

        return wait_until(follow, timeout, 0.1,
                          lambda: f"verifier stats in the expected state; last seen: {last[-1:]}")


def current(port: int) -> verifier_pb2.EngineStats:
    return watch_until(port, lambda s: True)


def idle(stats: verifier_pb2.EngineStats) -> bool:
    """Nothing running or queued, and every KV block back on the free list."""
    return (stats.running == 0 and stats.waiting == 0
            and stats.kv_blocks_free == stats.kv_blocks_total > 0)


def method(stats: verifier_pb2.EngineStats, name: str) -> verifier_pb2.MethodStats:
    """The per-method counters (all zero for a method that was never asked)."""
    for m in stats.methods:
        if m.method == name:
            return m
    return verifier_pb2.MethodStats(method=name)
