"""The generations of one REST request (several prompts, n choices each) run side by side and
are read as one stream of (choice index, message) in arrival order.

`start()` returns once every generation has sent its first message, so that an error the
verifier knows before the first token (a prompt too long, a full queue, ...) becomes the HTTP
status of the response rather than an event inside a 200 stream. Cancelling (or leaving the
iteration early) cancels every generation, which aborts them in the verifier.
"""

from __future__ import annotations

import asyncio
from contextlib import nullcontext
from typing import AsyncIterator

from opentelemetry import trace

from gateway.frontend import Frontend
from protos import common_pb2
from splitspec.errors import ServiceError

_END = object()


class Fanout:
    def __init__(self, frontend: Frontend, requests: list[common_pb2.GenerateRequest],
                 span=None):
        self._queue: asyncio.Queue = asyncio.Queue()
        self._buffer: list[tuple[int, object]] = []
        self._open = len(requests)
        # The pumps inherit the span as their context: their verifier calls are its children.
        with trace.use_span(span, end_on_exit=False) if span is not None else nullcontext():
            self._tasks = [asyncio.create_task(self._pump(frontend, i, r))
                           for i, r in enumerate(requests)]

    async def _pump(self, frontend: Frontend, index: int,
                    request: common_pb2.GenerateRequest) -> None:
        try:
            async for msg in frontend.stream(request):
                await self._queue.put((index, msg))
        except ServiceError as exc:
            await self._queue.put((index, exc))
        finally:
            await self._queue.put((index, _END))

    async def start(self) -> None:
        """Wait for every generation's first message; raise the first error sent before one."""
        started: set[int] = set()
        try:
            while len(started) < len(self._tasks):
                index, item = await self._queue.get()
                if isinstance(item, ServiceError) and index not in started:
                    raise item
                started.add(index)
                self._buffer.append((index, item))
        except BaseException:
            self.cancel()
            raise

    async def __aiter__(self) -> AsyncIterator[tuple[int, common_pb2.GenerateResponse
                                                     | ServiceError]]:
        """(index, message or the ServiceError that ended it), until every generation ends."""
        try:
            while self._open:
                index, item = self._buffer.pop(0) if self._buffer else await self._queue.get()
                if item is _END:
                    self._open -= 1
                    continue
                yield index, item
        finally:
            self.cancel()

    def cancel(self) -> None:
        for t in self._tasks:
            t.cancel()
