"""The verifier's telemetry at startup: the Prometheus exporter and the span builder (both
EngineObservers), the /metrics endpoint, and the interceptor that carries each traced
request's context to the proposers. server.py creates one before the engine and passes
`observers` to it."""

from __future__ import annotations

from splitspec.telemetry import tracing
from splitspec.telemetry.config import VERIFIER_METRICS_PORT, TelemetryConfig
from splitspec.telemetry.metrics import ServiceTelemetry
from verifier_service.telemetry.metrics import VerifierMetrics
from verifier_service.telemetry.tracing import ProposeContextInterceptor, VerifierTracer

SERVICE_NAME = "splitspec-verifier"


class VerifierTelemetry(ServiceTelemetry):
    service_name = SERVICE_NAME

    def __init__(self, host: str, model: str, config: TelemetryConfig | None = None):
        super().__init__(host, config or TelemetryConfig(VERIFIER_METRICS_PORT))
        # --metrics-port 0: no exporter at all, not just no endpoint
        self.metrics = VerifierMetrics(self.registry) if self.config.metrics_port else None
        self.tracer: VerifierTracer | None = None
        active = tracing.active()
        if active is not None:
            self.tracer = VerifierTracer(active.tracer("splitspec.verifier"), model)
            # Before any proposer channel exists: they are made with this process's interceptors.
            active.extra_channel_interceptors.append(ProposeContextInterceptor(self.tracer))

    @property
    def observers(self) -> list:
        return [o for o in (self.metrics, self.tracer) if o is not None]

    def bind(self, engine) -> None:
        """Gauges (running, waiting, KV blocks) come from the engine's snapshot at scrape."""
        if self.metrics is not None:
            self.metrics.bind(engine.snapshot)

