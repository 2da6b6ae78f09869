"""gRPC edge of a proposer: protobuf in, ProposerSession calls, protobuf out; per message, its
metrics and (for traced requests) its span."""

from __future__ import annotations

import asyncio
import logging
import time

from proposer_service.ahead import AheadRunner
from proposer_service.base import Proposer
from proposer_service.telemetry.metrics import ProposerMetrics
from proposer_service.telemetry.tracing import ProposerTracer
from protos import proposer_pb2, proposer_pb2_grpc
from splitspec.proposal import (
    ahead_to_pb,
    checked_steps,
    description_to_pb,
    draft_to_pb,
    step_from_pb,
)

log = logging.getLogger(__name__)


async def _next(requests):
    """The next request of the stream, None at its end."""
    try:
        return await requests.__anext__()
    except StopAsyncIteration:
        return None


class SlowMessages:
    """Step messages that took long enough to miss a verifier's deadline, said in the log with
    where the time went: the first few, then every hundredth."""

    THRESHOLD_S = 0.25

    def __init__(self, method: str):
        self.method, self.count = method, 0

    def check(self, n: int, settle_s: float, propose_s: float) -> None:
        if settle_s + propose_s < self.THRESHOLD_S:
            return
        self.count += 1
        if self.count <= 3 or self.count % 100 == 0:
            log.warning("%s: a step message for %d sequence(s) took %.0f ms (waiting for the "
                        "drafting ahead %.0f ms, proposing %.0f ms); %d slow so far", self.method,
                        n, 1000 * (settle_s + propose_s), 1000 * settle_s, 1000 * propose_s,
                        self.count)


class ProposerServicer(proposer_pb2_grpc.ProposerServicer):
    def __init__(self, proposer: Proposer, metrics: ProposerMetrics | None = None,
                 tracer: ProposerTracer | None = None):
        self._proposer = proposer
        self._metrics = metrics
        self._tracer = tracer
        self._description = proposer.describe()
        self._slow = SlowMessages(self._description.method)
        if metrics is not None:
            metrics.fallbacks = getattr(proposer, "fallbacks", None)

    async def Propose(self, request_iterator, context):
        # One session per stream: a verifier's sequences live as long as its stream.
        session = self._proposer.open_session()
        ahead = AheadRunner(session)
        metrics, tracer = self._metrics, self._tracer
        if metrics is not None:
            metrics.streams += 1
        requests = request_iterator.__aiter__()
        next_request = asyncio.ensure_future(_next(requests))
        push = False  # the verifier takes pushes (ProposeRequest.push_ahead)
        try:
            while True:
                pending = ahead.pending_push() if push else None
                if pending is not None and not next_request.done():
                    # whichever comes first: the drafting ahead (push it) or the next step
                    await asyncio.wait({next_request, pending},
                                       return_when=asyncio.FIRST_COMPLETED)
                    if not next_request.done():
                        pushed = ahead.take_push()
                        if pushed:
                            yield proposer_pb2.ProposeResponse(
                                ahead=[ahead_to_pb(a) for a in pushed])
                        continue
                request = await next_request
                if request is None:
                    break
                next_request = asyncio.ensure_future(_next(requests))
                push = request.push_ahead
                start = time.perf_counter()
                span = tracer.start(request) if tracer is not None else None
                steps = checked_steps([step_from_pb(s) for s in request.sequences],
                                      self._description)
                await ahead.settle(steps)  # the outcome arrived: hit, or cancel and draft afresh
                settled = time.perf_counter()
                session.release(list(request.released))
                # Proposing may run a model: keep the event loop free for other streams.
                drafts = await asyncio.to_thread(session.propose, steps)
                self._slow.check(len(steps), settled - start, time.perf_counter() - settled)
                if metrics is not None:
                    metrics.released += len(request.released)
                    if steps:
                        metrics.on_message(len(steps), drafts, time.perf_counter() - start,
                                           answered=not request.outcome_only)
                if span is not None:
                    tracer.finish(span, drafts)
                ahead.start()  # draft the next step ahead while the verifier verifies this one
                if request.outcome_only:
                    continue  # the verifier took the pushed drafts: nobody waits for an answer
                yield proposer_pb2.ProposeResponse(step_id=request.step_id,
                                                   drafts=[draft_to_pb(d) for d in drafts])
        finally:
            next_request.cancel()
            await ahead.settle(None)
            session.close()
            if metrics is not None:
                metrics.streams -= 1

    async def Info(self, request, context):
        return description_to_pb(self._proposer.describe())
