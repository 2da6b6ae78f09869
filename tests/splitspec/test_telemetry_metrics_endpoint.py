"""`--metrics-port` on every service: on by default at the service's own port, 0 turns it off,
a taken port leaves the service running without metrics; the endpoint serves the registry."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from gateway.config import GatewayConfig
from splitspec.net import free_port
from splitspec.telemetry.config import (
    GATEWAY_METRICS_PORT,
    VERIFIER_METRICS_PORT,
    parse_service_config,
    stack_metrics_ports,
)
from splitspec.telemetry.metrics import new_registry, serve_metrics


def test_metrics_port_flag_is_on_by_default_and_zero_turns_it_off():
    config, telemetry = parse_service_config(GatewayConfig, ["--http-port", "8001"],
                                             GATEWAY_METRICS_PORT)
    assert config.http_port == 8001 and telemetry.metrics_port == GATEWAY_METRICS_PORT
    _, telemetry = parse_service_config(GatewayConfig, ["--metrics-port", "0"],
                                        GATEWAY_METRICS_PORT)
    assert telemetry.metrics_port == 0
    with pytest.raises(SystemExit):
        parse_service_config(GatewayConfig, ["--metrics-port", "70000"], GATEWAY_METRICS_PORT)


def test_stack_ports_are_consecutive_free_or_off():
    names = ["gateway", "verifier", "proposer-ngram"]
    assert stack_metrics_ports(names, GATEWAY_METRICS_PORT) == {
        "gateway": GATEWAY_METRICS_PORT, "verifier": VERIFIER_METRICS_PORT,
        "proposer-ngram": VERIFIER_METRICS_PORT + 1}
    assert set(stack_metrics_ports(names, 0).values()) == {0}
    free = stack_metrics_ports(names, None)
    assert len(set(free.values())) == 3 and all(free.values())


def test_endpoint_serves_the_registry_and_survives_a_taken_port(caplog):
    registry = new_registry()
    port = free_port()
    endpoint = serve_metrics(registry, "127.0.0.1", port, "test-service")
    assert endpoint is not None and endpoint.url == f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(endpoint.url, timeout=5) as r:
            body = r.read().decode()
        assert "process_cpu_seconds_total" in body or "python_info" in body
        assert serve_metrics(registry, "127.0.0.1", port, "second") is None
        assert "cannot serve metrics" in caplog.text
    finally:
        endpoint.close()
    assert serve_metrics(registry, "127.0.0.1", 0, "off") is None
    with socket.socket() as s:  # closed: nothing listens there any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
