"""gRPC edge of a proposer: protobuf in, ProposerSession calls, protobuf out."""

from __future__ import annotations

import asyncio
import logging

from proposer_service.base import Proposer
from splitspec.proposal import description_to_pb, draft_to_pb, step_from_pb
from protos import proposer_pb2, proposer_pb2_grpc

log = logging.getLogger(__name__)


class ProposerServicer(proposer_pb2_grpc.ProposerServicer):
    def __init__(self, proposer: Proposer):
        self._proposer = proposer

    async def Propose(self, request_iterator, context):
        # One session per stream: a verifier's sequences live as long as its stream.
        session = self._proposer.open_session()
        try:
            async for request in request_iterator:
                session.release(list(request.released))
                steps = [step_from_pb(s) for s in request.sequences]
                # Proposing may run a model: keep the event loop free for other streams.
                drafts = await asyncio.to_thread(session.propose, steps)
                yield proposer_pb2.ProposeResponse(step_id=request.step_id,
                                                   drafts=[draft_to_pb(d) for d in drafts])
        finally:
            session.close()

    async def Info(self, request, context):
        return description_to_pb(self._proposer.describe())
