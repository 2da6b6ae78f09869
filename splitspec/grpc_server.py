"""gRPC plumbing shared by every service: servers (error mapping, health, reflection, TLS) and
the channels services dial each other with.

`ErrorInterceptor` is the one place where a ServiceError raised by a handler becomes a gRPC
status; handlers never call `context.abort` for domain errors themselves. When tracing is on
(splitspec.telemetry.tracing), servers and channels also get the interceptors that carry the
trace context in gRPC metadata.

TLS (splitspec/tls.py has the credentials): `make_server(tls)` checks each call's client identity
against the allow-list before the handler runs (PERMISSION_DENIED, mapped like any error), and
`listen(server, address, tls)` serves TLS only, with client certificates required when the
server's files have a CA. A `Dialer` gives the channel to one address, plaintext or TLS; after
the client's certificate files change it opens a new channel for new calls, while calls running
on the previous one go on (it is closed once they end, at most RETIRED_CHANNEL_GRACE_S later).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from splitspec.errors import InvalidArgument, ServiceError, StartupError, error_metadata
from splitspec.telemetry import tracing
from splitspec.tls import ClientTls, ServerTls

log = logging.getLogger(__name__)

# Bigger than the default 4 MiB: a step message may carry hidden states for many sequences.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Services on the other end restart (rollouts, crashes): notice within about a second
    # instead of gRPC's default backoff of up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


async def _abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    if isinstance(exc, ServiceError):
        await context.abort(exc.code, exc.message, trailing_metadata=error_metadata(exc))
    log.exception("unhandled error in handler")
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


class _Undecodable:
    """What a request that is not a valid message of its type decodes to: the handler
    answers INVALID_ARGUMENT instead of gRPC's generic error for a failed deserializer."""

    def __init__(self, exc: Exception):
        self.exc = exc


def _safe_deserializer(deserialize):
    if deserialize is None:
        return None

    def safe(data: bytes):
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - any decoding failure is the caller's
            return _Undecodable(exc)

    return safe


def _checked(request):
    if isinstance(request, _Undecodable):
        raise InvalidArgument("request", f"is not a valid message ({request.exc})")
    return request


async def _checked_stream(requests):
    async for request in requests:
        yield _checked(request)


# Runs before a handler: (method, context) -> None, or raises a ServiceError (the TLS caller check).
Guard = Callable[[str, grpc.aio.ServicerContext], None]


def _wrap_unary(behavior, streaming_request: bool = False, method: str = "",
                guard: Guard | None = None):
    async def handler(request, context):
        try:
            if guard is not None:
                guard(method, context)
            request = _checked_stream(request) if streaming_request else _checked(request)
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
            await _abort(context, exc)

    return handler


def _wrap_stream(behavior, streaming_request: bool = False, method: str = "",
                 guard: Guard | None = None):
    if not inspect.isasyncgenfunction(behavior):
        # a streaming handler that writes with context.write (grpc.health's Watch)
        return _wrap_unary(behavior, streaming_request, method, guard)

    async def handler(request, context):
        try:
            if guard is not None:
                guard(method, context)
            request = _checked_stream(request) if streaming_request else _checked(request)
            async for item in behavior(request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
            await _abort(context, exc)

    return handler


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps errors to statuses; `guard` (the TLS caller check) runs first in every handler, so
    that its refusal is mapped the same way."""

    def __init__(self, guard: Guard | None = None):
        self.guard = guard

    async def intercept_service(self, continuation, handler_call_details):
        h = await continuation(handler_call_details)
        if h is None:
            return None
        at = dict(method=handler_call_details.method, guard=self.guard)
        common = dict(request_deserializer=_safe_deserializer(h.request_deserializer),
                      response_serializer=h.response_serializer)
        if h.unary_unary:
            return grpc.unary_unary_rpc_method_handler(_wrap_unary(h.unary_unary, **at), **common)
        if h.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_wrap_unary(h.stream_unary, True, **at),
                                                        **common)
        if h.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_wrap_stream(h.unary_stream, **at),
                                                        **common)
        return grpc.stream_stream_rpc_method_handler(_wrap_stream(h.stream_stream, True, **at),
                                                     **common)


# A second server on a taken port fails to start instead of silently sharing it.
SERVER_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)]


def make_server(tls: ServerTls | None = None) -> grpc.aio.Server:
    """A server with the shared interceptors; with `tls` and its allow-list, every call but
    health and reflection is checked against the caller's certificate identities."""
    guard = tls.peers if tls is not None else None
    return grpc.aio.server(interceptors=[*tracing.server_interceptors(), ErrorInterceptor(guard)],
                           options=SERVER_OPTIONS)


def add_health_and_reflection(server: grpc.aio.Server,
                              service_full_names: Iterable[str]) -> health.aio.HealthServicer:
    """Serve grpc.health.v1 (all listed services SERVING) and server reflection."""
    names = list(service_full_names)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        names + [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                 reflection.SERVICE_NAME], server)
    return health_servicer


async def mark_serving(health_servicer: health.aio.HealthServicer,
                       service_full_names: Iterable[str]) -> None:
    for name in ["", *service_full_names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)


async def mark_not_serving(health_servicer: health.aio.HealthServicer,
                           service_full_names: Iterable[str]) -> None:
    for name in ["", *service_full_names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)


def listen(server: grpc.aio.Server, address: str, tls: ServerTls | None = None) -> int:
    """Bind the server to address, TLS only when `tls` is given; a port that is taken or invalid
    is a StartupError."""
    try:
        port = (server.add_secure_port(address, tls.grpc_credentials()) if tls is not None
                else server.add_insecure_port(address))
    except RuntimeError as exc:
        raise StartupError(f"cannot listen on {address}: {exc}") from None
    if not port:
        raise StartupError(f"cannot listen on {address}")
    return port


def open_channel(address: str, tls: ClientTls | None = None,
                 server_name: str | None = None) -> grpc.aio.Channel:
    """A channel to `address`: plaintext, or TLS with the client's current credentials checking
    the server's certificate for `server_name` (default: the address's host)."""
    interceptors = tracing.channel_interceptors() or None
    if tls is None:
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS,
                                         interceptors=interceptors)
    options = [*CHANNEL_OPTIONS,
               *([("grpc.ssl_target_name_override", server_name)] if server_name else [])]
    return grpc.aio.secure_channel(address, tls.credentials(), options=options,
                                   interceptors=interceptors)


# A channel left behind by rotation is closed once its calls end, or this long after.
RETIRED_CHANNEL_GRACE_S = 3600.0


class Dialer:
    """The channel to one address. With TLS, channel() opens a new channel once the client's
    certificate files changed (new calls handshake with the new certificate); the previous
    channel keeps its running calls, established streams included, and is closed when they end.
    `on_redial` is called after each such change (e.g. to reopen a long-lived watch)."""

    def __init__(self, address: str, tls: ClientTls | None = None,
                 server_name: str | None = None, on_redial: Callable[[], None] | None = None):
        self.address, self.tls, self.server_name = address, tls, server_name
        self.on_redial = on_redial
        self._channel: grpc.aio.Channel | None = None
        self._generation = -1
        self._retiring: dict[grpc.aio.Channel, asyncio.Task] = {}
        self.redials = 0  # channels replaced after a rotation

    def channel(self) -> grpc.aio.Channel:
        if self.tls is not None:
            self.tls.refresh()
            if self._channel is not None and self.tls.generation != self._generation:
                self._retire(self._channel)
                self._channel = None
                self.redials += 1
                log.info("credentials for %s changed: new calls use a new channel", self.address)
                if self.on_redial is not None:
                    self.on_redial()
        if self._channel is None:
            self._channel = open_channel(self.address, self.tls, self.server_name)
            self._generation = self.tls.generation if self.tls is not None else 0
        return self._channel

    def _retire(self, channel: grpc.aio.Channel) -> None:
        task = asyncio.get_running_loop().create_task(
            channel.close(grace=RETIRED_CHANNEL_GRACE_S))
        self._retiring[channel] = task
        task.add_done_callback(lambda _: self._retiring.pop(channel, None))

    async def close(self) -> None:
        for channel, task in list(self._retiring.items()):
            task.cancel()
            await channel.close()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
