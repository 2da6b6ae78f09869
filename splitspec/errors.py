"""Errors that cross a service edge, and the one table that maps them to gRPC and HTTP codes.

Handlers raise these; an interceptor (gRPC) or an exception handler (REST) turns them into
status codes, so no handler chooses a status code itself.
"""

from __future__ import annotations

import grpc

# Trailing metadata key that carries the offending field of an error across a gRPC hop.
FIELD_METADATA_KEY = "splitspec-field"
# Trailing metadata key (and HTTP header) that tells a client when to try again, in seconds.
RETRY_AFTER_METADATA_KEY = "retry-after"

# gRPC status -> HTTP status, used by the gateway for errors that come back from a verifier.
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


def http_status(code: grpc.StatusCode) -> int:
    return _HTTP_STATUS.get(code, 500)


class ServiceError(Exception):
    """An error with a gRPC status code; `field` names the offending request field, if any."""

    code = grpc.StatusCode.INTERNAL
    retry_after_s: int | None = None  # when set: the client may retry after this many seconds

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field

    http: int | None = None  # an HTTP status finer than the gRPC code's (413, 408)

    @property
    def http_status(self) -> int:
        return self.http or http_status(self.code)

    def __str__(self) -> str:
        return self.message


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, message: str):
        # The message always starts with the field so that a client can see what to fix.
        super().__init__(f"{field}: {message}", field=field)


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retry_after_s = 1  # queues drain in about a request's time


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ServiceError):
    """A verified caller whose identity this service does not serve (splitspec/tls.py)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class RequestTooLarge(ServiceError):
    """A request body over the gateway's limit (HTTP 413)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http = 413


class RequestTimeout(ServiceError):
    """A client that did not send its request in time (HTTP 408)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED
    http = 408


class StartupError(Exception):
    """A service cannot start with the configuration it was given (a device that is not
    there, a model directory that is not one, a port it cannot listen on). Its main() prints
    the message on one line and exits with status 2, no traceback."""


class DeviceUnavailable(StartupError, RuntimeError):
    pass


class BadModel(StartupError, FileNotFoundError):
    pass


class BadOption(StartupError, ValueError):
    pass


def from_rpc_error(exc: grpc.aio.AioRpcError) -> ServiceError:
    """An error a downstream service returned, re-raised with the same status code."""
    metadata = dict(exc.trailing_metadata() or ())
    err = ServiceError(exc.details() or exc.code().name, field=metadata.get(FIELD_METADATA_KEY))
    err.code = exc.code()
    retry_after = metadata.get(RETRY_AFTER_METADATA_KEY)
    if isinstance(retry_after, str) and retry_after.isdigit():
        err.retry_after_s = int(retry_after)
    elif err.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        err.retry_after_s = ResourceExhausted.retry_after_s
    return err


def error_metadata(exc: ServiceError) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that carries an error's field and retry delay across gRPC."""
    out = []
    if exc.field:
        out.append((FIELD_METADATA_KEY, exc.field))
    if exc.retry_after_s is not None:
        out.append((RETRY_AFTER_METADATA_KEY, str(exc.retry_after_s)))
    return tuple(out)
