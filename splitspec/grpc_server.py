"""gRPC server plumbing shared by every service: error mapping, health, reflection.

`ErrorInterceptor` is the one place where a ServiceError raised by a handler becomes a gRPC
status; handlers never call `context.abort` for domain errors themselves. When tracing is on
(splitspec.telemetry.tracing), servers and channels also get the interceptors that carry the
trace context in gRPC metadata.
"""

from __future__ import annotations

import inspect
import logging
from typing import Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from splitspec.errors import InvalidArgument, ServiceError, StartupError, error_metadata
from splitspec.telemetry import tracing

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


def _wrap_unary(behavior, streaming_request: bool = False):
    async def handler(request, context):
        try:
            request = _checked_stream(request) if streaming_request else _checked(request)
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
            await _abort(context, exc)

    return handler


def _wrap_stream(behavior, streaming_request: bool = False):
    if not inspect.isasyncgenfunction(behavior):
        # a streaming handler that writes with context.write (grpc.health's Watch)
        return _wrap_unary(behavior, streaming_request)

    async def handler(request, context):
        try:
            request = _checked_stream(request) if streaming_request else _checked(request)
            async for item in behavior(request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
            await _abort(context, exc)

    return handler


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        h = await continuation(handler_call_details)
        if h is None:
            return None
        common = dict(request_deserializer=_safe_deserializer(h.request_deserializer),
                      response_serializer=h.response_serializer)
        if h.unary_unary:
            return grpc.unary_unary_rpc_method_handler(_wrap_unary(h.unary_unary), **common)
        if h.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_wrap_unary(h.stream_unary, True),
                                                        **common)
        if h.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_wrap_stream(h.unary_stream), **common)
        return grpc.stream_stream_rpc_method_handler(_wrap_stream(h.stream_stream, True),
                                                     **common)


# A second server on a taken port fails to start instead of silently sharing it.
SERVER_OPTIONS = [*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)]


def make_server() -> grpc.aio.Server:
    return grpc.aio.server(interceptors=[*tracing.server_interceptors(), ErrorInterceptor()],
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


def listen(server: grpc.aio.Server, address: str) -> int:
    """Bind the server to address; a port that is taken or invalid is a StartupError."""
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise StartupError(f"cannot listen on {address}: {exc}") from None
    if not port:
        raise StartupError(f"cannot listen on {address}")
    return port


def insecure_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS,
                                     interceptors=tracing.channel_interceptors() or None)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
