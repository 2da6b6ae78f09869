"""OpenTelemetry tracing, configured only through the standard OTEL_* environment variables.

Nothing is recorded or exported unless the environment asks for it:

  OTEL_TRACES_EXPORTER          otlp | console | none (comma-separated list); when unset, otlp
                                if an OTLP endpoint is set, else tracing stays off
  OTEL_EXPORTER_OTLP_ENDPOINT   e.g. http://127.0.0.1:4317 (grpc) or http://127.0.0.1:4318
  (or ..._TRACES_ENDPOINT)      (http/protobuf; the exporter appends /v1/traces)
  OTEL_EXPORTER_OTLP_PROTOCOL   grpc (default) | http/protobuf  (or ..._TRACES_PROTOCOL)
  OTEL_SERVICE_NAME             default: the service's own (splitspec-gateway, ...)
  OTEL_TRACES_SAMPLER(_ARG)     read by the SDK, e.g. parentbased_traceidratio and 0.1
  OTEL_SDK_DISABLED=true        off, whatever else is set

The exporters read their own variables as usual (headers, timeout, compression, insecure), and
the batch span processor its OTEL_BSP_* ones. Context crosses services in gRPC metadata
(W3C traceparent, via opentelemetry-instrumentation-grpc) on the Generate calls; the
verifier -> proposer stream carries it per message instead (see
verifier_service/telemetry/tracing.py).

Tracing is process-wide, as OpenTelemetry's own state is: `setup_tracing` installs the tracer
provider and records which gRPC interceptors servers and channels of this process get
(`splitspec.grpc_server` asks `active()`). Components take their tracer explicitly.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Mapping

import grpc

log = logging.getLogger(__name__)

# gRPC calls that get a span of their own: the request path. Health checks, Info, the stats
# stream and the long-lived Propose stream (traced per message instead) do not.
TRACED_RPCS = frozenset({"/splitspec.v1.Generation/Generate", "/splitspec.v1.Verifier/Generate"})
EXPORTERS = ("otlp", "console")
PROTOCOLS = ("grpc", "http/protobuf")


@dataclass(frozen=True)
class TraceSettings:
    """What the environment asks for."""

    exporters: tuple[str, ...] = ()  # empty: tracing off
    protocol: str = "grpc"

    @property
    def enabled(self) -> bool:
        return bool(self.exporters)


def settings_from_env(environ: Mapping[str, str] | None = None) -> TraceSettings:
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return TraceSettings()
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")
             if n.strip()]
    if not names and (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                      or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        names = ["otlp"]
    if "none" in names:
        return TraceSettings()
    for n in names:
        if n not in EXPORTERS:
            raise ValueError(f"OTEL_TRACES_EXPORTER: {n!r} is not supported "
                             f"(one or more of {', '.join(EXPORTERS)}, or none)")
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip().lower()
    if "otlp" in names and protocol not in PROTOCOLS:
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported "
                         f"({' or '.join(PROTOCOLS)})")
    return TraceSettings(tuple(dict.fromkeys(names)), protocol)


def build_provider(settings: TraceSettings, default_service_name: str):
    """A TracerProvider exporting as `settings` say (not installed globally). The sampler comes
    from OTEL_TRACES_SAMPLER (the SDK's default: parentbased_always_on)."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_service_name}))
    provider = TracerProvider(resource=resource)
    for name in settings.exporters:
        if name == "console":
            exporter = ConsoleSpanExporter()
        elif settings.protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            exporter = OTLPSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            exporter = OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _method(details) -> str:
    m = details.method
    return m.decode() if isinstance(m, bytes) else m


def _traced_rpc(details) -> bool:
    return _method(details) in TRACED_RPCS


@dataclass
class Tracing:
    """This process's tracing: the provider and the gRPC interceptors that carry context."""

    provider: object  # opentelemetry.sdk.trace.TracerProvider
    service_name: str
    settings: TraceSettings
    # Extra client interceptors for every channel of this process (the verifier adds the one
    # that puts each request's context on its Propose messages).
    extra_channel_interceptors: list = field(default_factory=list)

    def tracer(self, name: str):
        return self.provider.get_tracer(name)

    def server_interceptors(self) -> list:
        from opentelemetry.instrumentation.grpc import aio_server_interceptor

        return [aio_server_interceptor(tracer_provider=self.provider, filter_=_traced_rpc)]

    def channel_interceptors(self) -> list:
        from opentelemetry.instrumentation.grpc import aio_client_interceptors

        return [*aio_client_interceptors(tracer_provider=self.provider, filter_=_traced_rpc),
                *self.extra_channel_interceptors]

    def shutdown(self) -> None:
        """Flush what is queued (at most OTEL_BSP_EXPORT_TIMEOUT) and stop the exporters."""
        self.provider.shutdown()


_active: Tracing | None = None


def active() -> Tracing | None:
    """This process's tracing, or None when it is off."""
    return _active


def setup_tracing(default_service_name: str,
                  environ: Mapping[str, str] | None = None) -> Tracing | None:
    """Configure tracing from the environment; call once, before any gRPC server or channel
    is made. Returns None (and changes nothing) when the environment asks for no tracing."""
    global _active
    try:
        settings = settings_from_env(environ)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if not settings.enabled:
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME

    provider = build_provider(settings, default_service_name)
    trace.set_tracer_provider(provider)
    name = str(provider.resource.attributes.get(SERVICE_NAME))
    _active = Tracing(provider, name, settings)
    log.info("tracing on: service %s, exporters %s (%s)", name, ",".join(settings.exporters),
             settings.protocol)
    return _active


def shutdown_tracing() -> None:
    global _active
    if _active is not None:
        _active.shutdown()
        _active = None


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    return _active.server_interceptors() if _active is not None else []


def channel_interceptors() -> list:
    return _active.channel_interceptors() if _active is not None else []


def ns(t: float) -> int:
    """time.time() seconds -> OpenTelemetry nanoseconds."""
    return int(t * 1e9)


def carrier_of(span) -> dict[str, str]:
    """The W3C trace context (traceparent, tracestate) naming `span` as the parent."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    return carrier


def context_from(carrier: Mapping[str, str]):
    """The context a W3C carrier (headers, metadata, a message's map) names; empty if none."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier)
