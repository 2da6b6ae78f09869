"""Every dashboard query against a real Prometheus scraping a running stack (`make e2e-metrics`).

    python scripts/e2e_metrics.py [--model DIR] [--requests 4] [--keep]

Installs Debian's `prometheus` package with apt when the binary is missing (as root), starts the
stack on free ports with every proposer found beside the model, starts Prometheus scraping the
services' /metrics every second, sends a workload (each proposer method, speculation off,
greedy and sampled), and evaluates every PromQL query of
k8s/splitspec/dashboards/splitspec-metrics.json.
Exits 1 if any query returns no data. `--keep` leaves everything running for a look at
Prometheus' own UI until Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from splitspec.config import DEFAULT_MODEL  # noqa: E402
from splitspec.launcher import Stack, StackConfig, sibling_proposer_models  # noqa: E402
from splitspec.net import free_port  # noqa: E402
from splitspec.telemetry import dashboards  # noqa: E402

PROMPTS = ["def fibonacci(n):\n", "import json\n\nclass Config:\n    def __init__(self, path):\n",
           "for line in sys.stdin:\n", "if __name__ == '__main__':\n"]


def ensure_prometheus() -> None:
    if shutil.which("prometheus"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit("prometheus is not installed: apt-get install prometheus (Debian/Ubuntu), or "
                 "put a prometheus binary on PATH")
    print("installing Debian's prometheus package ...", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"],
                   check=True, env=env)


def workload(stack: Stack, methods: list[str], requests: int) -> int:
    jobs = []
    for i in range(requests):
        prompt = PROMPTS[i % len(PROMPTS)]
        temperature = 0.0 if i % 2 == 0 else 0.8
        for m in methods:
            jobs.append((prompt, {"mode": "on", "method": m, "num_speculative_tokens": 4},
                         temperature))
        jobs.append((prompt, {"mode": "off"}, temperature))

    def one(job) -> int:
        prompt, spec, temperature = job
        r = httpx.post(stack.url + "/v1/completions", timeout=300, json={
            "prompt": prompt, "max_tokens": 32, "temperature": temperature, "seed": 1,
            "ignore_eos": True, "speculation": spec})
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"]

    with ThreadPoolExecutor(4) as pool:
        return sum(pool.map(one, jobs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / DEFAULT_MODEL))
    ap.add_argument("--requests", type=int, default=4, help="requests per configuration")
    ap.add_argument("--keep", action="store_true", help="keep running until Ctrl-C")
    args = ap.parse_args()
    ensure_prometheus()
    models = sibling_proposer_models(args.model)
    config = StackConfig.with_free_ports(model=args.model, device="cpu", models=models,
                                         log_dir=ROOT / "bench/out/e2e-metrics-logs",
                                         verifier_args=["--proposer-timeout-ms", "2000"])
    print(f"starting the stack (proposers: ngram{''.join(', ' + m for m in models)}) ...",
          flush=True)
    with Stack(config) as stack:
        targets = {name: [url.removeprefix("http://").removesuffix("/metrics")]
                   for name, url in stack.metrics_urls.items()}
        with dashboards.PrometheusServer(targets, free_port(), interval_s=1.0) as prom:
            print(f"prometheus on {prom.url}, scraping {', '.join(stack.metrics_urls.values())}",
                  flush=True)
            prom.wait_for_scrapes(2)
            methods = list(stack.proposers)
            tokens = workload(stack, methods, args.requests)
            print(f"workload: {tokens} tokens over methods {methods} and off", flush=True)
            prom.wait_for_scrapes(3)
            failed = 0
            dash = dashboards.load(dashboards.METRICS_DASHBOARD)
            for q in dashboards.prometheus_queries(dash):
                result = prom.query(dashboards.substitute(q.expr))
                values = ", ".join(f"{float(r['value'][1]):.4g}" for r in result[:4])
                more = f" (+{len(result) - 4})" if len(result) > 4 else ""
                status = "ok  " if result else "EMPTY"
                failed += not result
                print(f"{status} {q.panel} [{q.ref_id}]: {len(result)} series: {values}{more}")
            print(f"\n{len(dashboards.prometheus_queries(dash)) - failed} queries with data, "
                  f"{failed} empty", flush=True)
            if args.keep:
                print(f"running: Prometheus UI at {prom.url}; Ctrl-C stops", flush=True)
                try:
                    while True:
                        time.sleep(1)
                except KeyboardInterrupt:
                    pass
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
