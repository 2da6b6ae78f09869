"""Prometheus plumbing shared by the services: a registry per service, the /metrics endpoint on
the service's `--metrics-port`, and the buckets of the latency histograms.

Each service keeps its counters in its own exporter (gateway/metrics.py,
verifier_service/telemetry/metrics.py, proposer_service/telemetry/metrics.py); hot paths add to
plain integers and a collector turns them into counter families when Prometheus scrapes, so a step
costs a few additions, not a lock per counter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)

# Request-level latencies: time to first token, end to end, queue time (seconds).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5,
                   2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, float("inf"))
# Per-token and per-step times: time per output token, verifier step, proposer round trip.
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05,
                0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, float("inf"))


def new_registry() -> CollectorRegistry:
    """A registry of the service's own, with the process's CPU, memory and Python runtime."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


@dataclass
class MetricsEndpoint:
    """The running /metrics HTTP server (a daemon thread)."""

    url: str
    _server: object

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve_metrics(registry: CollectorRegistry, host: str, port: int,
                  service: str) -> MetricsEndpoint | None:
    """Serve `registry` on http://host:port/metrics; port 0 turns metrics off. A port that is
    taken is reported and the service goes on without metrics: serving comes first."""
    if port == 0:
        log.info("%s: metrics off (--metrics-port 0)", service)
        return None
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        log.error("%s: cannot serve metrics on %s:%d (%s); continuing without metrics",
                  service, host, port, exc.strerror or exc)
        return None
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/metrics"
    log.info("%s: metrics on %s", service, url)
    return MetricsEndpoint(url, server)


def counter(name: str, doc: str, labels: Iterable[str] = (),
            samples: Iterable[tuple[tuple[str, ...], float]] = ()) -> CounterMetricFamily:
    """A counter family (`name` without `_total`) from (label values, value) pairs."""
    family = CounterMetricFamily(name, doc, labels=list(labels))
    for values, value in samples:
        family.add_metric(list(values), value)
    return family


def with_old_name(family: CounterMetricFamily, old_name: str) -> Iterator[CounterMetricFamily]:
    """A renamed counter family, then the same samples under its old name (`old_name` without
    `_total`), kept for one release so that existing dashboards and alerts keep working."""
    yield family
    old = CounterMetricFamily(old_name, f"Deprecated: renamed {family.name}_total. "
                              + family.documentation, labels=None)
    old.samples = [s._replace(name=old_name + s.name[len(family.name):]) for s in family.samples]
    yield old


def gauge(name: str, doc: str, value: float | None = None, labels: Iterable[str] = (),
          samples: Iterable[tuple[tuple[str, ...], float]] = ()) -> GaugeMetricFamily:
    """A gauge family: one unlabelled `value`, or (label values, value) pairs."""
    family = GaugeMetricFamily(name, doc, value=value, labels=list(labels) if labels else None)
    for values, v in samples:
        family.add_metric(list(values), v)
    return family


def histogram(registry: CollectorRegistry, name: str, doc: str, buckets: Iterable[float],
              labels: Iterable[str] = ()) -> Histogram:
    """A histogram in `registry`; exporters observe it on the spot (a histogram is not a plain
    integer a collector could read at scrape time)."""
    return Histogram(name, doc, list(labels), buckets=tuple(buckets), registry=registry)


class ServiceTelemetry:
    """What every service's telemetry holds: its config, its registry and its /metrics endpoint.
    Subclasses add their exporter (None when --metrics-port is 0) and span builder."""

    service_name = "splitspec"

    def __init__(self, host: str, config):
        self.config = config
        self.host = config.metrics_host or host
        self.registry = new_registry()
        self.endpoint: MetricsEndpoint | None = None

    def start(self) -> str | None:
        """Serve /metrics; returns its URL (None: off or the port was taken)."""
        self.endpoint = serve_metrics(self.registry, self.host, self.config.metrics_port,
                                      self.service_name)
        return self.endpoint.url if self.endpoint else None

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
