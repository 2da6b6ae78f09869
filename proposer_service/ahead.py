"""Drafting ahead on the proposer's side: drafting ahead between two step messages.

After a step's drafts are answered, the session drafts the next step ahead for the likely
outcomes of this one (ProposerSession.draft_ahead) in a worker thread, while the verifier
verifies. When the next message (the outcome) arrives, the drafting ahead is awaited when the
outcome may be among those drafted, else cancelled; propose() then answers from it on a hit or
drafts afresh on a miss. The session is only ever used by one thread at a time.

    verifier  |--verify t--|o|--verify t+1--|o|          o: outcome = the next step message
    proposer  |ahead t+1 ..|h|ahead t+2 ...|h|          h: hit, answered at once

A verifier that takes pushes (ProposeRequest.push_ahead) gets what was drafted ahead as soon as
it is ready (`pending_push` / `take_push`, ProposeResponse.ahead). When its outcome is among
them it verifies the pushed draft at once and only tells the outcome (outcome_only): the hit
costs no round trip.

    verifier  |--verify t--|o|--verify t+1--|o|
    proposer  |ahead t+1|p    |h|ahead t+2|p               p: push; h: outcome applied, no answer
"""

from __future__ import annotations

import asyncio
import logging
import threading

from proposer_service.base import ProposerSession
from splitspec.proposal import AheadDraft, SequenceStep

log = logging.getLogger(__name__)


class AheadRunner:
    def __init__(self, session: ProposerSession):
        self._session = session
        self._task: asyncio.Future | None = None
        self._cancel = threading.Event()
        self._pushed = False  # what the running (or finished) drafting ahead made was pushed

    def start(self) -> None:
        """After answering a step: draft ahead when the session has something to draft."""
        if self._task is not None or not self._session.has_ahead_work():
            return
        self._cancel = threading.Event()
        self._pushed = False
        self._task = asyncio.ensure_future(
            asyncio.to_thread(self._session.draft_ahead, self._cancel))

    def pending_push(self) -> asyncio.Future | None:
        """The drafting ahead whose result has not been pushed yet (None: nothing to push)."""
        return None if self._pushed else self._task

    def take_push(self) -> list[AheadDraft]:
        """Once the drafting ahead finished: its drafts, to push (each drafting ahead is pushed
        at most once; nothing when it failed or was cancelled)."""
        task, self._pushed = self._task, True
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return []
        return self._session.ahead_drafts()

    async def settle(self, steps: list[SequenceStep] | None) -> None:
        """Before the next step touches the session: wait for the drafting ahead, cancelling it
        first when no outcome in steps can hit (None: cancel, e.g. the stream ends)."""
        task, self._task = self._task, None
        if task is None:
            return
        if steps is None or not self._session.ahead_may_hit(steps):
            self._cancel.set()
        try:
            await task
        except Exception:  # noqa: BLE001 - drafting ahead is an optimisation, never a failure
            log.exception("drafting ahead failed; drafting afresh")

    def abandon(self) -> None:
        """The session is being discarded: stop drafting ahead without waiting for it."""
        task, self._task = self._task, None
        if task is not None:
            self._cancel.set()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
