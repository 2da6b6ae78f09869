"""An error's field and retry delay cross a gRPC hop in trailing metadata and come back out of
the RPC error the caller sees (the gateway relays a verifier's 429 with its Retry-After)."""

from __future__ import annotations

import grpc
from grpc.aio import Metadata

from splitspec.errors import (
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
    error_metadata,
    from_rpc_error,
)


def relayed(exc):
    rpc = grpc.aio.AioRpcError(exc.code, Metadata(), Metadata(*error_metadata(exc)),
                               exc.message)
    return from_rpc_error(rpc)


def test_field_and_retry_after_survive_a_hop():
    full = relayed(ResourceExhausted("queue: full"))
    assert full.code == grpc.StatusCode.RESOURCE_EXHAUSTED and full.retry_after_s == 1
    assert full.http_status == 429
    bad = relayed(InvalidArgument("top_p", "must be in (0, 1]"))
    assert bad.field == "top_p" and bad.retry_after_s is None
    assert relayed(Unavailable("gone")).retry_after_s is None
