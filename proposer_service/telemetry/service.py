"""A proposer's telemetry at startup: its Prometheus exporter and /metrics endpoint, and its
span builder when tracing is on. server.py creates one and hands both to the servicer."""

from __future__ import annotations

from proposer_service.telemetry.metrics import ProposerMetrics
from proposer_service.telemetry.tracing import ProposerTracer
from splitspec.telemetry import tracing
from splitspec.telemetry.config import PROPOSER_METRICS_PORT, TelemetryConfig
from splitspec.telemetry.metrics import ServiceTelemetry


def service_name(method: str) -> str:
    """The default OTEL_SERVICE_NAME of a proposer process."""
    return f"splitspec-proposer-{method}"


class ProposerTelemetry(ServiceTelemetry):
    def __init__(self, method: str, host: str, config: TelemetryConfig | None = None):
        super().__init__(host, config or TelemetryConfig(PROPOSER_METRICS_PORT))
        self.method = method
        self.service_name = service_name(method)
        # --metrics-port 0: no exporter at all, not just no endpoint
        self.metrics = (ProposerMetrics(self.registry, method) if self.config.metrics_port
                        else None)
        active = tracing.active()
        self.tracer = (ProposerTracer(active.tracer("splitspec.proposer"), method)
                       if active is not None else None)
