"""The gateway's telemetry at startup: its Prometheus exporter and /metrics endpoint, and its
GenAI span builder when tracing is on (splitspec/telemetry/tracing.py reads OTEL_*)."""

from __future__ import annotations

from gateway.metrics import GatewayMetrics
from gateway.tracing import GatewayTracer
from gateway.verifier_pool import VerifierPool
from splitspec.telemetry import tracing
from splitspec.telemetry.config import GATEWAY_METRICS_PORT, TelemetryConfig
from splitspec.telemetry.metrics import ServiceTelemetry

SERVICE_NAME = "splitspec-gateway"


class GatewayTelemetry(ServiceTelemetry):
    service_name = SERVICE_NAME

    def __init__(self, host: str, pool: VerifierPool, config: TelemetryConfig | None = None):
        super().__init__(host, config or TelemetryConfig(GATEWAY_METRICS_PORT))
        self.metrics = GatewayMetrics(  # --metrics-port 0: no exporter at all
            self.registry, lambda: {r.address: r.in_flight for r in pool.replicas},
            lambda: pool.resumed_streams,
            lambda: pool.routing_decisions) if self.config.metrics_port else None
        active = tracing.active()
        self.tracer = GatewayTracer(active.tracer("splitspec.gateway")) if active else None
