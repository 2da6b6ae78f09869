"""The Grafana dashboards in k8s/splitspec/dashboards/ as data: their PromQL queries, the metric
names those name, and a real Prometheus server to evaluate them against a running stack.

Used by the dashboard tests (every query parses and names only exported metrics) and by
`make e2e-metrics` (scripts/e2e_metrics.py: every query returns data from a real Prometheus).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO_ROOT / "k8s" / "splitspec" / "dashboards"  # in the chart: it ships them
METRICS_DASHBOARD = DASHBOARDS / "splitspec-metrics.json"
TRACES_DASHBOARD = DASHBOARDS / "splitspec-traces.json"

# What Grafana's variables become when a query is run outside Grafana.
DEFAULT_VARIABLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m",
                     "method": ".*"}


@dataclass(frozen=True)
class Query:
    panel: str
    ref_id: str
    expr: str


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def _panels(dashboard: dict) -> Iterable[dict]:
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])  # collapsed rows keep their panels inside


def prometheus_queries(dashboard: dict) -> list[Query]:
    """Every PromQL expression of the dashboard's panels."""
    return [Query(p.get("title", ""), t.get("refId", ""), t["expr"])
            for p in _panels(dashboard) for t in p.get("targets", []) if "expr" in t]


def variable_metrics(dashboard: dict) -> list[str]:
    """Metrics named by `label_values(metric, label)` template variables."""
    out = []
    for v in dashboard.get("templating", {}).get("list", []):
        q = v.get("query")
        text = q.get("query", "") if isinstance(q, dict) else str(q or "")
        m = re.match(r"\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,", text)
        if m:
            out.append(m.group(1))
    return out


def substitute(expr: str, variables: dict[str, str] | None = None) -> str:
    """Grafana variables ($name, ${name}) replaced by concrete values."""
    values = {**DEFAULT_VARIABLES, **(variables or {})}

    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for dashboard variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (after `substitute`). Raises if it does not parse."""
    import promql_parser

    names: set[str] = set()

    def visit(node) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for m in node.matchers.matchers:
                if m.name == "__name__":
                    names.add(m.value)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def exported_names(families: Iterable) -> set[str]:
    """Sample names a registry's collected families can produce (Prometheus' view)."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum",
                                                                 "_created"),
                "summary": ("", "_count", "_sum", "_created"), "gauge": ("",), "info": ("_info",),
                "gaugehistogram": ("_bucket", "_gcount", "_gsum"), "stateset": ("",),
                "unknown": ("",)}
    out: set[str] = set()
    for f in families:
        out.update(f.name + s for s in suffixes.get(f.type, ("",)))
        out.update(s.name for s in f.samples)
    return out


# -- a real Prometheus ---------------------------------------------------------------------------

class PrometheusServer:
    """`prometheus` (e.g. Debian's package) scraping `targets` every `interval_s`, with its
    data in a temporary directory; a context manager."""

    def __init__(self, targets: dict[str, list[str]], port: int, interval_s: float = 1.0,
                 binary: str = "prometheus"):
        path = shutil.which(binary)
        if path is None:
            raise FileNotFoundError(f"{binary} is not installed (Debian: apt-get install "
                                    "prometheus)")
        self.binary = path
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._dir = Path(tempfile.mkdtemp(prefix="splitspec-prometheus-"))
        jobs = []
        for job, addresses in targets.items():
            jobs.append(f"  - job_name: {json.dumps(job)}\n"
                        f"    static_configs:\n      - targets: {json.dumps(addresses)}\n")
        every = f"{max(int(interval_s * 1000), 100)}ms"
        (self._dir / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {every}\n  evaluation_interval: {every}\n"
            "scrape_configs:\n" + "".join(jobs))
        self._proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> "PrometheusServer":
        try:
            return self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout_s: float) -> "PrometheusServer":
        self._log = open(self._dir / "prometheus.log", "wb")
        self._proc = subprocess.Popen(
            [self.binary, f"--config.file={self._dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self._dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("prometheus did not become ready")

    def log(self) -> str:
        return (self._dir / "prometheus.log").read_text(errors="replace")

    def api(self, path: str, **params) -> dict:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list:
        """An instant query now; the result's series (empty list: no data)."""
        return self.api("query", query=expr)["result"]

    def targets_up(self) -> dict[str, str]:
        return {t["scrapeUrl"]: t["health"] for t in self.api("targets")["activeTargets"]}

    def wait_for_scrapes(self, n: int = 2, timeout_s: float = 30.0) -> None:
        """Until every target has been scraped successfully `n` more times."""
        def counts() -> dict[str, float]:
            return {r["metric"].get("instance", ""): float(r["value"][1])
                    for r in self.query("count_over_time(up[10m])")}
        start = counts()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            now = counts()
            if now and all(now.get(k, 0) >= start.get(k, 0) + n for k in now) and all(
                    h == "up" for h in self.targets_up().values()):
                return
            time.sleep(0.5)
        raise RuntimeError(f"targets not scraped in time: {self.targets_up()}")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "PrometheusServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
