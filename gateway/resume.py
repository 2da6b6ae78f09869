"""What the gateway remembers of a stream so that another verifier replica can continue it.

A stream's progress is the output the client already has: token ids and text, as they came.
When the replica serving it goes away mid-stream, the request is sent again with that output in
`GenerateRequest.resume`; the new replica prefills prompt + output and continues at the same
positions, so greedy and seeded output is what the first replica would have produced (see
docs/reliability.md). Which failures are worth a resume is decided here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from protos import common_pb2

# A replica that died (connection reset, socket closed), refused to start a request (draining,
# not ready) or gave up on one while shutting down answers UNAVAILABLE.
RESUMABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})


def resumable(exc: grpc.aio.AioRpcError, retrying: bool = False) -> bool:
    """Whether a stream that ended with exc is worth trying elsewhere. retrying: the stream
    already broke once and this was a later try: a replica shutting down cancels the calls it
    has not finished, so CANCELLED from it is part of the same failure."""
    return exc.code() in RESUMABLE_CODES or (retrying and
                                             exc.code() == grpc.StatusCode.CANCELLED)


@dataclass
class StreamProgress:
    request: common_pb2.GenerateRequest
    output_ids: list[int] = field(default_factory=list)
    sent_chars: int = 0
    resumes: int = 0

    def observe(self, msg: common_pb2.GenerateResponse) -> common_pb2.GenerateResponse:
        """Record a chunk on its way to the client; it keeps the request's own id whichever
        replica (and attempt) produced it."""
        self.output_ids.extend(msg.token_ids)
        self.sent_chars += len(msg.text)
        msg.request_id = self.request.request_id
        return msg

    def next_request(self) -> common_pb2.GenerateRequest:
        """The request for the next attempt: as given first; after a failure, under a fresh id
        (the old replica may still hold the old one) and with the output so far."""
        if self.resumes == 0 and not self.output_ids:
            return self.request
        req = common_pb2.GenerateRequest()
        req.CopyFrom(self.request)
        req.request_id = f"{self.request.request_id}~r{self.resumes}"
        if self.output_ids:
            req.resume.output_token_ids.extend(self.output_ids)
            req.resume.sent_text_chars = self.sent_chars
        return req
