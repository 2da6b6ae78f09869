"""Front-door limits of the REST API: the request body's size and read time, and each API
key's concurrent requests. A limit of 0 is off."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import grpc
from starlette.requests import ClientDisconnect, Request

from splitspec.errors import RequestTimeout, RequestTooLarge, ResourceExhausted, ServiceError


class ClientGone(ServiceError):
    """The client closed the connection before its request was read."""

    code = grpc.StatusCode.CANCELLED


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """The whole body, refused as soon as it is known to exceed `max_bytes` (from
    Content-Length, else while reading) or takes longer than `timeout_s` to arrive."""
    declared = request.headers.get("content-length")
    if max_bytes and declared and declared.isdigit() and int(declared) > max_bytes:
        raise RequestTooLarge(f"body: {declared} bytes is over the limit of {max_bytes}", "body")
    chunks, size = [], 0
    deadline = time.monotonic() + timeout_s if timeout_s else None
    stream = request.stream().__aiter__()
    while True:
        try:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            chunk = await asyncio.wait_for(stream.__anext__(), left)
        except StopAsyncIteration:
            return b"".join(chunks)
        except asyncio.TimeoutError:
            raise RequestTimeout(f"body: not received within {timeout_s:g} s", "body") from None
        except ClientDisconnect:
            raise ClientGone("body: the client disconnected", "body") from None
        size += len(chunk)
        if max_bytes and size > max_bytes:
            raise RequestTooLarge(f"body: over the limit of {max_bytes} bytes", "body")
        chunks.append(chunk)


class ConcurrencyLimit:
    """At most `limit` requests in flight per API key (requests without a key share one
    count); one more gets 429 with Retry-After."""

    def __init__(self, limit: int):
        self.limit = limit
        self._in_flight: Counter[str] = Counter()

    def acquire(self, key: str) -> None:
        if self.limit and self._in_flight[key] >= self.limit:
            raise ResourceExhausted(
                f"too many concurrent requests for this API key (limit {self.limit})")
        self._in_flight[key] += 1

    def release(self, key: str) -> None:
        self._in_flight[key] -= 1
        if self._in_flight[key] <= 0:
            del self._in_flight[key]
