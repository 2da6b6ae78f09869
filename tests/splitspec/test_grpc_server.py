"""The shared gRPC server factory: a second server on a port already served fails to bind
instead of sharing it (gRPC turns SO_REUSEPORT on by default, so two services or two test
stacks on one port would silently split its connections between them)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from splitspec import grpc_server
from splitspec.net import free_port

REUSEPORT_OFF = ("grpc.so_reuseport", 0)


def server_options(monkeypatch) -> list[tuple[str, object]]:
    """The options make_server passes to grpc.aio.server."""
    seen = {}
    real = grpc.aio.server

    def spy(*args, **kwargs):
        seen["options"] = list(kwargs.get("options") or (args[3] if len(args) > 3 else []))
        return real(*args, **kwargs)

    async def make():  # an aio server needs a running event loop
        grpc_server.make_server()

    monkeypatch.setattr(grpc.aio, "server", spy)
    try:
        asyncio.run(make())
    finally:
        monkeypatch.undo()
    return seen["options"]


def check_second_server_cannot_bind(make_server) -> None:
    async def scenario():
        first, second = make_server(), make_server()
        address = f"127.0.0.1:{free_port()}"
        try:
            assert first.add_insecure_port(address)
            await first.start()
            with pytest.raises(RuntimeError, match="bind"):
                second.add_insecure_port(address)
        finally:
            await first.stop(0)
            await second.stop(0)

    asyncio.run(scenario())


def test_a_second_server_cannot_share_a_port(monkeypatch):
    assert REUSEPORT_OFF in server_options(monkeypatch)
    check_second_server_cannot_bind(grpc_server.make_server)


def test_the_check_catches_servers_that_share_a_port():
    """Negative control: with gRPC's default (SO_REUSEPORT on) the second bind succeeds, and the
    check above fails; with the option off it passes."""
    with pytest.raises(pytest.fail.Exception):
        check_second_server_cannot_bind(lambda: grpc.aio.server())
    check_second_server_cannot_bind(lambda: grpc.aio.server(options=[REUSEPORT_OFF]))


def test_a_service_error_without_a_field_keeps_its_status_code():
    from protos import verifier_pb2, verifier_pb2_grpc
    from splitspec.errors import InvalidArgument, ResourceExhausted

    class Refusing(verifier_pb2_grpc.VerifierServicer):
        async def Abort(self, request, context):
            if request.request_id == "field":
                raise InvalidArgument("request_id", "is odd")
            raise ResourceExhausted("the verifier's queue is full")

    async def scenario():
        server = grpc_server.make_server()
        verifier_pb2_grpc.add_VerifierServicer_to_server(Refusing(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = verifier_pb2_grpc.VerifierStub(ch)
                codes = []
                for rid in ("field", "no-field"):
                    try:
                        await stub.Abort(verifier_pb2.AbortRequest(request_id=rid), timeout=10)
                    except grpc.aio.AioRpcError as exc:
                        codes.append(exc.code())
                return codes
        finally:
            await server.stop(0)

    assert asyncio.run(scenario()) == [grpc.StatusCode.INVALID_ARGUMENT,
                                       grpc.StatusCode.RESOURCE_EXHAUSTED]
