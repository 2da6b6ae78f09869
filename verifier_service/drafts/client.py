"""The verifier's side of the Propose stream, behind one small interface.

`ProposerClient.propose` sends one step message and returns the drafts, or None when nothing
usable arrived before the deadline. Answers carry the step id they belong to; an answer that
arrives after its step gave up waiting is dropped, never applied to a later step.

Every time a client (re)opens its stream it starts a new `epoch`: the proposer's state for this
verifier is new then, so the engine sends each sequence's full history on the next step.

Pushes (drafting ahead): steps that ask the proposer to draft ahead also ask it to push
what it drafted ahead as soon as it is ready (ProposeResponse.ahead: a draft per likely
outcome). When every sequence of the next step finds its outcome among the pushed drafts,
`propose` returns those at once and sends the outcomes without waiting for an answer
(outcome_only): the proposer continues from the same drafts, so a hit costs no round trip.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import logging
import time

import grpc

from protos import common_pb2, proposer_pb2, proposer_pb2_grpc
from splitspec.grpc_server import Dialer
from splitspec.proposal import (
    AheadDraft,
    Draft,
    ProposerDescription,
    SequenceStep,
    ahead_from_pb,
    description_from_pb,
    draft_from_pb,
    step_to_pb,
)
from splitspec.tls import ClientTls

log = logging.getLogger(__name__)


class ProposerMismatch(RuntimeError):
    """The proposer cannot serve this target (different vocabulary)."""


def check_compatible(desc: ProposerDescription, vocab_size: int, fingerprint: str) -> None:
    if desc.vocab_size and desc.vocab_size != vocab_size:
        raise ProposerMismatch(
            f"proposer {desc.method!r} ({desc.model}) has vocabulary size {desc.vocab_size}, "
            f"the target has {vocab_size}: refusing it")
    if desc.tokenizer_fingerprint and desc.tokenizer_fingerprint != fingerprint:
        raise ProposerMismatch(
            f"proposer {desc.method!r} ({desc.model}) uses a different tokenizer "
            f"(fingerprint {desc.tokenizer_fingerprint} != target {fingerprint}): refusing it")


class ProposerClient(abc.ABC):
    def __init__(self, method: str):
        self.method = method
        self.epoch = 0
        self.description: ProposerDescription | None = None
        self._released: list[str] = []

    @property
    @abc.abstractmethod
    def connected(self) -> bool: ...

    @property
    def address(self) -> str:
        return "in-process"

    def release(self, seq_ids: list[str]) -> None:
        """Queue sequences that ended; they are sent with the next message."""
        self._released.extend(seq_ids)

    @property
    def has_released(self) -> bool:
        """Whether releases wait to be sent (flush_released has something to do)."""
        return bool(self._released)

    def _take_released(self) -> list[str]:
        released, self._released = self._released, []
        return released

    async def ensure_connected(self) -> bool:
        """Called before a step's messages are built, so they match the current epoch."""
        return self.connected

    @abc.abstractmethod
    async def propose(self, steps: list[SequenceStep], timeout_s: float) -> list[Draft] | None: ...

    async def flush_released(self) -> None:
        """Send queued releases even when no sequence of this proposer runs this step."""

    async def close(self) -> None: ...


class GrpcProposerClient(ProposerClient):
    def __init__(self, method: str, address: str, vocab_size: int, fingerprint: str,
                 reconnect_interval_s: float = 1.0, tls: ClientTls | None = None,
                 server_name: str | None = None):
        super().__init__(method)
        self._address = address
        self._vocab_size = vocab_size
        self._fingerprint = fingerprint
        self._reconnect_interval_s = reconnect_interval_s
        # with TLS, a stream opened after a certificate rotation goes over a new channel; the
        # stream already open stays on its own until it ends
        self._dialer = Dialer(address, tls, server_name)
        self._call = None
        self._reader: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._pushed: dict[str, list[AheadDraft]] = {}  # per sequence, for its next step
        self._step_ids = itertools.count(1)
        self._last_attempt = -float("inf")
        self.late_answers = 0
        self.missed_deadlines = 0

    @property
    def address(self) -> str:
        return self._address

    @property
    def connected(self) -> bool:
        return self._call is not None

    async def connect(self, timeout_s: float = 5.0) -> None:
        """Open channel and stream. Raises ProposerMismatch for an incompatible proposer."""
        self._last_attempt = time.monotonic()
        await self._drop_stream()
        stub = proposer_pb2_grpc.ProposerStub(self._dialer.channel())
        info = await stub.Info(common_pb2.Empty(), timeout=timeout_s)
        desc = description_from_pb(info)
        if desc.method != self.method:
            raise ProposerMismatch(f"{self._address} serves method {desc.method!r}, "
                                   f"configured as {self.method!r}")
        check_compatible(desc, self._vocab_size, self._fingerprint)
        self.description = desc
        self._released.clear()  # a new stream starts with no state to release
        self._call = stub.Propose()
        self.epoch += 1
        self._reader = asyncio.create_task(self._read_loop(self._call))
        log.info("connected to %s proposer at %s (epoch %d)", self.method, self._address,
                 self.epoch)

    async def ensure_connected(self) -> bool:
        if self._call is not None:
            return True
        if time.monotonic() - self._last_attempt < self._reconnect_interval_s:
            return False
        try:
            await self.connect(timeout_s=1.0)
        except ProposerMismatch:
            raise
        except (grpc.aio.AioRpcError, asyncio.TimeoutError) as exc:
            detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else "timed out"
            log.warning("%s proposer at %s unavailable: %s", self.method, self._address, detail)
            return False
        return True

    async def _read_loop(self, call) -> None:
        try:
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    break
                if resp.ahead:  # a push: replaces what was pushed for these sequences
                    pushed: dict[str, list[AheadDraft]] = {}
                    for msg in resp.ahead:
                        a = ahead_from_pb(msg)
                        pushed.setdefault(a.draft.seq_id, []).append(a)
                    self._pushed.update(pushed)
                    continue
                fut = self._pending.pop(resp.step_id, None)
                if fut is None or fut.done():
                    self.late_answers += 1  # its step stopped waiting: drop it
                    continue
                fut.set_result(resp)
        except grpc.aio.AioRpcError as exc:
            log.warning("%s proposer stream ended: %s", self.method, exc.code())
        except asyncio.CancelledError:
            return
        finally:
            if self._call is call:
                self._call = None
                for fut in self._pending.values():
                    if not fut.done():
                        fut.set_result(None)
                self._pending.clear()

    async def _send(self, request: proposer_pb2.ProposeRequest, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._call.write(request), timeout_s)
            return True
        except (grpc.aio.AioRpcError, asyncio.TimeoutError, asyncio.InvalidStateError,
                AttributeError) as exc:
            log.warning("%s proposer write failed: %r", self.method, exc)
            await self._drop_stream()
            return False

    def release(self, seq_ids: list[str]) -> None:
        super().release(seq_ids)
        for sid in seq_ids:
            self._pushed.pop(sid, None)

    def _take_pushed(self, steps: list[SequenceStep]) -> list[Draft] | None:
        """Every step's draft from the pushes, or None when one has no pushed draft for its
        outcome. Whatever was pushed for these sequences is stale after this step either way."""
        found = []
        for step in steps:
            a = next((a for a in self._pushed.pop(step.seq_id, ()) if a.serves(step)), None)
            found.append(None if a is None or not step.draft_ahead else a.taken(step.k))
        return None if not found or None in found else found

    async def propose(self, steps, timeout_s):
        deadline = time.monotonic() + timeout_s
        if not await self.ensure_connected():
            return None
        push = any(s.draft_ahead for s in steps)
        taken = self._take_pushed(steps)
        if taken is not None:  # tell the outcomes; the proposer continues from these drafts
            request = proposer_pb2.ProposeRequest(step_id=next(self._step_ids),
                                                  sequences=[step_to_pb(s) for s in steps],
                                                  released=self._take_released(),
                                                  push_ahead=True, outcome_only=True)
            return taken if await self._send(request, timeout_s) else None
        step_id = next(self._step_ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[step_id] = fut
        request = proposer_pb2.ProposeRequest(step_id=step_id,
                                              sequences=[step_to_pb(s) for s in steps],
                                              released=self._take_released(), push_ahead=push)
        if not await self._send(request, max(deadline - time.monotonic(), 1e-3)):
            return None
        try:
            resp = await asyncio.wait_for(asyncio.shield(fut),
                                          max(deadline - time.monotonic(), 1e-3))
        except asyncio.TimeoutError:
            self._pending.pop(step_id, None)
            self._missed(timeout_s, len(steps))
            return None
        if resp is None:
            return None
        return [draft_from_pb(d) for d in resp.drafts]

    def _missed(self, timeout_s: float, n: int) -> None:
        """A step that got no answer before its deadline: said in the log, the first ones and
        then every hundredth (each costs a step's speculation and its whole deadline)."""
        self.missed_deadlines += 1
        if self.missed_deadlines <= 3 or self.missed_deadlines % 100 == 0:
            log.warning("%s proposer at %s sent no draft for %d sequence(s) within the %.0f ms "
                        "deadline (%d missed steps so far)", self.method, self._address, n,
                        1000 * timeout_s, self.missed_deadlines)

    async def flush_released(self) -> None:
        if not self._released or self._call is None:
            return
        request = proposer_pb2.ProposeRequest(step_id=next(self._step_ids),
                                              released=self._take_released())
        await self._send(request, 1.0)

    async def _drop_stream(self) -> None:
        call, self._call = self._call, None
        self._pushed.clear()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_result(None)
        self._pending.clear()
        if call is not None:
            call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None

    async def close(self) -> None:
        await self._drop_stream()
        await self._dialer.close()
