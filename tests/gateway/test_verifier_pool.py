"""The gateway's retries over verifier replicas (gateway/verifier_pool.py), against scripted
stubs: which failure a client is told when a stream's replica goes away."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.verifier_pool import Replica, VerifierPool
from protos import common_pb2
from splitspec.errors import Unavailable


def _error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class _Stub:
    """Generate answers each call with the next scripted outcome: a list of responses to
    stream, then the error to end with (None: end cleanly)."""

    def __init__(self, script):
        self.script = list(script)
        self.calls = 0

    def Generate(self, request):
        responses, error = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return _Call(responses, error)


class _Call:
    def __init__(self, responses, error):
        self.responses, self.error = responses, error

    def __aiter__(self):
        return self._run()

    async def _run(self):
        for r in self.responses:
            yield r
        if self.error is not None:
            raise self.error

    def cancel(self):
        pass


def _pool(monkeypatch, stub) -> VerifierPool:
    monkeypatch.setattr(VerifierPool, "_watch", lambda self: None)  # no health stream
    monkeypatch.setattr(Replica, "stub", property(lambda self: stub))
    return VerifierPool(("127.0.0.1:1",), resume_wait_s=0.0)


def _run(pool):
    async def go():
        out = []
        async for msg in pool.generate(common_pb2.GenerateRequest(request_id="r")):
            out.append(msg)
        return out
    return asyncio.run(go())


def test_a_retry_cancelled_by_its_stopping_replica_reports_why_the_stream_broke(monkeypatch):
    """The replica fails the stream (its tensor-parallel rank is gone) and, still marked
    serving, is tried again while it stops: that call is cancelled. The client is told the
    first reason, not CANCELLED."""
    lost = _error(grpc.StatusCode.UNAVAILABLE, "verifier: tensor-parallel rank 1 exited")
    stub = _Stub([([common_pb2.GenerateResponse(token_ids=[5])], lost),
                  ([], _error(grpc.StatusCode.CANCELLED, "CANCELLED"))])
    with pytest.raises(Unavailable, match="tensor-parallel rank 1 exited"):
        _run(_pool(monkeypatch, stub))
    assert stub.calls >= 2


def test_a_first_call_cancelled_is_not_retried(monkeypatch):
    """CANCELLED on a stream that had not failed before is that call's own answer."""
    stub = _Stub([([], _error(grpc.StatusCode.CANCELLED, "CANCELLED"))])
    with pytest.raises(Exception, match="CANCELLED") as caught:
        _run(_pool(monkeypatch, stub))
    assert not isinstance(caught.value, Unavailable) and stub.calls == 1
