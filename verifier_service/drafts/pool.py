"""One proposer method served by several processes: the verifier's client for a proposer pool.

`--proposer ngram=splitspec-proposer-ngram:50052` names a pool. The name is resolved to every
address behind it (a headless Service: one per ready pod; or a comma-separated list of
HOST:PORT), and the pool holds one `GrpcProposerClient` per address, made by
`member_factory(address, host)` (host: the name the address was found under, which a TLS
client checks the member's certificate for). It is itself a
`ProposerClient`, so the engine sees one proposer per method, whatever the number of pods.

- **Placement.** Each sequence lives on one member, so its drafting state (n-gram index, draft
  KV cache) stays on one pod. A new sequence goes to the live member with the fewest sequences
  (then the fewest ever given, then the highest rendezvous hash of sequence id and address) and
  stays there until that member is gone.
- **One step.** The step's message is split by member, the parts are sent concurrently under
  the step's deadline, and the answers are merged. A member that fails the step costs only the
  drafts of its own sequences.
- **Moving a sequence.** The pool keeps every sequence's token history (the deltas the engine
  sends, applied like a proposer does). When a sequence reaches a member that has not heard of
  it on its current stream (moved there because its member died or left, or its member
  reconnected), the pool sends that member the full history itself. So the pool's own `epoch`
  never changes: a pod's death resends only that pod's sequences, not everyone's.
- **Membership.** The name is resolved again every `--proposer-resolve-interval-s` seconds, and
  soon after a member's stream breaks. New addresses join; vanished ones leave and are closed. A
  failed lookup keeps the members it had. Members that are down are reconnected in the
  background (1 s, doubling to 5 s between attempts), never on a step's path. A member whose
  model does not fit the target is refused: at startup the verifier exits, later it is left out.

Per-member counters (`member_stats`) are logged when members join or leave and when the pool
closes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from splitspec.history_store import HistoryStore
from splitspec.proposal import Draft, SequenceStep
from verifier_service.drafts.addresses import Resolver, resolve_dns, split_target
from verifier_service.drafts.client import ProposerClient, ProposerMismatch

log = logging.getLogger(__name__)

MIN_RESOLVE_GAP_S = 1.0  # re-resolution after a member broke waits at least this long
REVIVE_BACKOFF_S = (1.0, 5.0)  # first and largest wait between reconnection attempts


@dataclass
class MemberStats:
    """Counters per member address, monotonically increasing."""

    steps: int = 0  # step messages sent to it
    sequences: int = 0  # sequence entries in those messages
    full_histories: int = 0  # entries sent with the full history (new to it, or resent)
    moved_in: int = 0  # sequences placed here after their member died or left
    missed: int = 0  # step messages with no usable answer before the deadline


@dataclass
class _Member:
    client: ProposerClient
    given: int = 0  # sequences ever placed here
    refused: bool = False  # incompatible model: never used
    backoff_s: float = 0.0
    next_attempt: float = 0.0


@dataclass
class _Placement:
    address: str
    epoch: int = -1  # the member's epoch when it last heard of the sequence; -1: not yet


def _score(seq_id: str, address: str) -> int:
    digest = hashlib.blake2b(f"{seq_id}|{address}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class ProposerPool(ProposerClient):
    def __init__(self, method: str, target: str,
                 member_factory: Callable[[str, str], ProposerClient],
                 resolve_interval_s: float = 5.0, resolver: Resolver = resolve_dns,
                 idle_timeout_s: float = 600.0):
        super().__init__(method)
        self._target = target
        self._entries = split_target(target)
        self._factory = member_factory
        self._resolver = resolver
        self._resolve_interval_s = resolve_interval_s
        self._members: dict[str, _Member] = {}
        self._found: dict[tuple[str, int], list[str]] = {}  # last lookup result per entry
        self._resolved_once = False
        self._last_resolve = -float("inf")
        self._history = HistoryStore(idle_timeout_s)
        self._placement: dict[str, _Placement] = {}
        self.member_stats: dict[str, MemberStats] = {}
        self._wake = asyncio.Event()
        self._maintainer: asyncio.Task | None = None
        self._reviver: asyncio.Task | None = None

    # -- what the engine sees ---------------------------------------------------------------

    @property
    def address(self) -> str:
        return self._target

    @property
    def connected(self) -> bool:
        return bool(self._live())

    @property
    def members(self) -> list[str]:
        return sorted(self._members)

    def placement(self, seq_id: str) -> str | None:
        """The member address a sequence lives on, if any."""
        p = self._placement.get(seq_id)
        return p.address if p else None

    async def connect(self, timeout_s: float = 5.0) -> None:
        """Resolve and connect every member. Raises ProposerMismatch when a member cannot serve
        this target, ConnectionError when none is reachable."""
        await self.refresh()
        members = list(self._members.values())
        results = await asyncio.gather(*(self._connect_member(m, timeout_s) for m in members),
                                       return_exceptions=True)
        for m, r in zip(members, results):
            if isinstance(r, ProposerMismatch):
                m.refused = True
                raise r
        self._update_description()
        self._start_maintenance()
        if not self._live():
            raise ConnectionError(f"no {self.method} proposer reachable at {self._target}")

    async def ensure_connected(self) -> bool:
        if not self._resolved_once:
            await self.refresh()
        self._start_maintenance()
        self._revive_due_members()
        self._update_description()
        return bool(self._live())

    async def propose(self, steps: list[SequenceStep], timeout_s: float) -> list[Draft] | None:
        deadline = time.monotonic() + timeout_s
        answers: list[Draft] = []
        batches: dict[str, list[SequenceStep]] = {}
        live = self._live()
        for step in steps:
            # Always applied, even with no member to send to: the engine counts it as heard.
            history = self._history.apply(step)
            if history is None:  # a delta for a history this pool does not hold
                self._forget_placement(step.seq_id)
                answers.append(Draft(step.seq_id, resync=True))
                continue
            if not live:
                continue
            address = self._place(step.seq_id, live)
            placed, client = self._placement[step.seq_id], self._members[address].client
            if not step.full_history and placed.epoch != client.epoch:
                step = dataclasses.replace(step, new_tokens=list(history), full_history=True)
            placed.epoch = client.epoch
            batches.setdefault(address, []).append(step)
        idle = [a for a in live if a not in batches]
        results = await asyncio.gather(
            *(self._ask(a, batch, deadline) for a, batch in batches.items()),
            *(self._members[a].client.flush_released() for a in idle), return_exceptions=True)
        got_any = False
        for drafts in results[:len(batches)]:
            if drafts is None or isinstance(drafts, BaseException):
                continue
            got_any = True
            for d in drafts:
                placed = self._placement.get(d.seq_id)
                if d.resync and placed is not None:
                    placed.epoch = -1  # the member lost it: full history next time
            answers.extend(drafts)
        return answers if got_any or answers else None

    def release(self, seq_ids: list[str]) -> None:
        self._history.release(seq_ids)
        for sid in seq_ids:
            self._forget_placement(sid)

    @property
    def has_released(self) -> bool:
        return any(m.client.has_released for m in self._members.values())

    async def flush_released(self) -> None:
        pending = [m.client for m in self._members.values()
                   if m.client.connected and m.client.has_released]
        if pending:  # most steps: nothing to send, no tasks to start
            await asyncio.gather(*(c.flush_released() for c in pending), return_exceptions=True)

    async def close(self) -> None:
        for task in (self._maintainer, self._reviver):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._maintainer = self._reviver = None
        members, self._members = list(self._members.values()), {}
        await asyncio.gather(*(m.client.close() for m in members), return_exceptions=True)
        if self.member_stats:
            log.info("%s proposer pool %s closed: %s", self.method, self._target,
                     self.stats_line())

    def stats_line(self) -> str:
        return "; ".join(f"{a} steps={s.steps} sequences={s.sequences} "
                         f"full_histories={s.full_histories} moved_in={s.moved_in} "
                         f"missed={s.missed}"
                         for a, s in sorted(self.member_stats.items()))

    # -- placement ----------------------------------------------------------------------------

    def _live(self) -> list[str]:
        return [a for a, m in self._members.items() if not m.refused and m.client.connected]

    def _place(self, seq_id: str, live: list[str]) -> str:
        placed = self._placement.get(seq_id)
        if placed is not None and placed.address in live:
            return placed.address  # sticky
        if placed is not None:
            self._forget_placement(seq_id)  # its member is gone or down
        load = Counter(p.address for p in self._placement.values())
        address = min(live, key=lambda a: (load[a], self._members[a].given, -_score(seq_id, a)))
        self._members[address].given += 1
        if placed is not None:
            self.member_stats[address].moved_in += 1
        self._placement[seq_id] = _Placement(address)
        return address

    def _forget_placement(self, seq_id: str) -> None:
        """Drop a sequence's placement; its member forgets it too when it still holds it."""
        placed = self._placement.pop(seq_id, None)
        member = self._members.get(placed.address) if placed else None
        if member is not None and member.client.connected and member.client.epoch == placed.epoch:
            member.client.release([seq_id])

    async def _ask(self, address: str, batch: list[SequenceStep],
                   deadline: float) -> list[Draft] | None:
        member, stats = self._members[address], self.member_stats[address]
        stats.steps += 1
        stats.sequences += len(batch)
        stats.full_histories += sum(s.full_history for s in batch)
        try:
            drafts = await member.client.propose(batch, max(deadline - time.monotonic(), 1e-3))
        except Exception:  # noqa: BLE001 - one member's failure costs only its drafts
            log.exception("%s proposer at %s failed a step", self.method, address)
            drafts = None
        if drafts is None:
            stats.missed += 1
            if not member.client.connected:
                self._wake.set()  # its pod may be gone: look the name up again soon
        return drafts

    # -- membership ---------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Resolve the target again; add members that appeared, close those that left."""
        self._last_resolve = time.monotonic()
        found: dict[str, str] = {}  # member address -> the host name it was found under
        for entry in self._entries:
            try:
                self._found[entry] = await self._resolver(*entry)
            except OSError as exc:
                log.warning("%s proposers: cannot resolve %s:%d (%s); keeping %d known",
                            self.method, *entry, exc, len(self._found.get(entry, [])))
            for address in self._found.get(entry, []):
                found.setdefault(address, entry[0])
        self._resolved_once = True
        joined = [a for a in found if a not in self._members]
        left = [a for a in self._members if a not in found]
        for address in joined:
            self._members[address] = _Member(self._factory(address, found[address]))
            self.member_stats.setdefault(address, MemberStats())
        gone = [self._members.pop(a) for a in left]
        if joined or left:
            log.info("%s proposers at %s: %d members (joined: %s; left: %s)", self.method,
                     self._target, len(self._members), ", ".join(joined) or "-",
                     ", ".join(left) or "-")
        await asyncio.gather(*(m.client.close() for m in gone), return_exceptions=True)

    def forget_idle(self) -> list[str]:
        """Forget sequences not heard of for idle_timeout_s (ended without a release, e.g. after
        a RESYNC on their last step); their members forget them too."""
        stale = self._history.evict_idle()
        for sid in stale:
            self._forget_placement(sid)
        return stale

    async def _connect_member(self, member: _Member, timeout_s: float) -> None:
        connect = getattr(member.client, "connect", None)
        if connect is not None:
            await connect(timeout_s=timeout_s)
        else:
            await member.client.ensure_connected()

    def _update_description(self) -> None:
        for m in self._members.values():
            if not m.refused and m.client.description is not None:
                self.description = m.client.description
                return

    def _start_maintenance(self) -> None:
        if self._maintainer is None or self._maintainer.done():
            self._maintainer = asyncio.create_task(self._maintain(),
                                                   name=f"proposer-pool-{self.method}")

    async def _maintain(self) -> None:
        while True:
            wait_s = self._resolve_interval_s
            try:
                await asyncio.wait_for(self._wake.wait(), wait_s)
                # Woken by a broken member: not more often than MIN_RESOLVE_GAP_S.
                await asyncio.sleep(max(0.0, self._last_resolve + MIN_RESOLVE_GAP_S
                                        - time.monotonic()))
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - the pool keeps its members and tries again
                log.exception("%s proposers: refreshing members failed", self.method)
            self.forget_idle()
            self._revive_due_members()

    def _revive_due_members(self) -> None:
        if self._reviver is not None and not self._reviver.done():
            return
        now = time.monotonic()
        due = [m for m in self._members.values()
               if not m.refused and not m.client.connected and m.next_attempt <= now]
        if due:
            self._reviver = asyncio.create_task(self._revive(due))

    async def _revive(self, members: list[_Member]) -> None:
        results = await asyncio.gather(*(m.client.ensure_connected() for m in members),
                                       return_exceptions=True)
        now = time.monotonic()
        for m, ok in zip(members, results):
            if isinstance(ok, ProposerMismatch):
                m.refused = True
                log.error("%s proposer at %s left out: %s", self.method, m.client.address, ok)
            elif ok is True:
                m.backoff_s = 0.0
            else:
                if isinstance(ok, BaseException):
                    log.warning("%s proposer at %s: reconnecting failed: %r", self.method,
                                m.client.address, ok)
                first, largest = REVIVE_BACKOFF_S
                m.backoff_s = min(max(2 * m.backoff_s, first), largest)
                m.next_attempt = now + m.backoff_s
        self._update_description()
