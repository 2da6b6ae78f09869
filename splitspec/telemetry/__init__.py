"""Telemetry shared by the services: OpenTelemetry tracing set up from the standard OTEL_*
environment variables (tracing.py), Prometheus metrics served on a port per service
(metrics.py), the `--metrics-port` flag (config.py), and a small OTLP trace sink for tests,
benchmarks and local debugging (otlp_sink.py). See docs/observability.md."""
