"""The telemetry flags every service takes beside its own config: `--metrics-port`.

Tracing has no flags: it is configured only through the standard OTEL_* environment variables
(splitspec/telemetry/tracing.py), so that one deployment setting reaches every service.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Sequence, TypeVar

from splitspec.config import add_arguments, from_namespace

T = TypeVar("T")

# Default metrics ports, one per kind of service: `splitspec up` gives every process its own.
GATEWAY_METRICS_PORT = 9400
VERIFIER_METRICS_PORT = 9401
PROPOSER_METRICS_PORT = 9402


@dataclass(frozen=True)
class TelemetryConfig:
    metrics_port: int  # Prometheus /metrics on the service's --host; 0: off
    metrics_host: str = ""  # empty: the service's --host


def service_parser(cls: type, metrics_port: int) -> argparse.ArgumentParser:
    """The command line of a service: its config dataclass's flags plus the telemetry flags."""
    parser = argparse.ArgumentParser(description=cls.__doc__)
    add_arguments(parser, cls)
    group = parser.add_argument_group("telemetry (tracing: the OTEL_* environment variables, "
                                      "see docs/observability.md)")
    group.add_argument("--metrics-port", type=int, default=metrics_port,
                       help=f"Prometheus /metrics port; 0: off (default: {metrics_port})")
    group.add_argument("--metrics-host", default="",
                       help="address of the metrics endpoint (default: the service's --host)")
    return parser


def parse_service_config(cls: type[T], argv: Sequence[str] | None,
                         metrics_port: int) -> tuple[T, TelemetryConfig]:
    """Parse a service's config dataclass plus the telemetry flags from one command line."""
    parser = service_parser(cls, metrics_port)
    ns = parser.parse_args(argv)
    if not 0 <= ns.metrics_port <= 65535:
        parser.error("--metrics-port: must be in [0, 65535]")
    return from_namespace(cls, ns), TelemetryConfig(ns.metrics_port, ns.metrics_host)


def stack_metrics_ports(names: Sequence[str], first: int | None) -> dict[str, int]:
    """Metrics ports for services started together (gateway, verifier, then proposers, in
    `names` order): consecutive from `first`; None: a free port each; 0: all off."""
    from splitspec.net import free_port

    if first is None:
        return {n: free_port() for n in names}
    return {n: (first + i if first else 0) for i, n in enumerate(names)}
