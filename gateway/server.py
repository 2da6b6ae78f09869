"""Entry point of the gateway: REST on --http-port and gRPC on --grpc-port, one event loop;
Prometheus metrics on --metrics-port. What the two doors share, and the order in which it starts
and stops, is gateway/lifecycle.py's; the REST door's HTTP server is gateway/http_server.py's.
SIGINT or SIGTERM stops the REST door (its requests in flight finish), then the rest."""

from __future__ import annotations

import logging
from typing import Sequence

from gateway.config import GatewayConfig
from gateway.http_server import HttpsContext, rest_server
from gateway.lifecycle import GatewayLifecycle
from gateway.telemetry import SERVICE_NAME as TELEMETRY_NAME
from splitspec.lifecycle import run_service
from splitspec.telemetry.config import GATEWAY_METRICS_PORT, TelemetryConfig

log = logging.getLogger("splitspec.gateway")


async def serve(config: GatewayConfig, telemetry_config: TelemetryConfig | None = None) -> None:
    gateway = GatewayLifecycle(config, telemetry_config)
    await gateway.start()
    https = HttpsContext(gateway.front_tls) if gateway.front_tls else None
    http = rest_server(gateway.rest_app(), config, https)
    if https is not None:
        https.start()
    log.info("gateway: REST %s://%s:%d, gRPC %s:%d%s, verifiers %s%s",
             "https" if gateway.front_tls else "http", config.host, config.http_port,
             config.host, config.grpc_port, " (TLS)" if gateway.front_tls else "",
             ", ".join(config.verifier), " (TLS)" if config.tls_ca else "")
    await http.serve()
    if https is not None:
        https.stop()
    await gateway.stop()


def main(argv: Sequence[str] | None = None) -> None:
    run_service(GatewayConfig, argv, GATEWAY_METRICS_PORT, serve, lambda _: TELEMETRY_NAME)


if __name__ == "__main__":
    main()
