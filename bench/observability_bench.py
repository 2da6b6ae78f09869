"""What tracing and metrics cost: tokens/s through the real services with each on and off.

    python bench/observability_bench.py [--quick] [--rounds 20] [--blocks 4] [--concurrency 4]

Three stacks (gateway + verifier + n-gram proposer each) run side by side on free ports:
  off      --metrics-port 0, no OTEL_* variables
  metrics  metrics on (scraped every 2 s, as a Prometheus would), tracing off
  traced   metrics on, tracing on: every span exported over OTLP/gRPC to a local sink
Each round sends the same workload (C concurrent clients, greedy, n-gram speculation, a fixed
number of output tokens) to each stack in turn, the order rotating per round so that drift on
the shared machine hits every configuration alike; idle stacks use no CPU. The stacks are
restarted every block of rounds, so that no configuration keeps a lucky or unlucky placement of
its processes. Reported: output tokens/s per configuration (median over rounds), the median of
the per-round ratios (metrics vs off, traced vs metrics), and the services' CPU time per token.

A second part measures, in this process, what the verifier's observers cost per engine step:
the Prometheus exporter's on_step, and turning a finished request's timeline into spans with
per-step detail as span events or as child spans (the cheaper one is the default).
Writes bench/reports/observability.md (with --quick: bench/out/observability-quick.md).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_common import interleaved_parser  # noqa: E402

from splitspec.launcher import Stack, StackConfig  # noqa: E402
from splitspec.telemetry.otlp_sink import OtlpSink  # noqa: E402

PROMPTS = ["def fibonacci(n):\n", "import json\n\nclass Config:\n    def __init__(self, path):\n",
           "for line in sys.stdin:\n    print(line)\nfor line in sys.stdin:\n",
           "if __name__ == '__main__':\n", "class Point:\n    def __init__(self, x, y):\n"]


class BenchStack(Stack):
    def __init__(self, config: StackConfig, env: dict[str, str]):
        super().__init__(config)
        self._env = env

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in Stack.environment().items() if not k.startswith("OTEL_")}
        return {**env, **self._env}


def cpu_seconds(stack: Stack) -> float:
    """CPU time (user + system) the stack's service processes have used so far."""
    total = 0.0
    for svc in stack.services:
        fields = Path(f"/proc/{svc.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def run_round(stack: Stack, clients: int, per_client: int, max_tokens: int,
              k: int, verify: bool | str = True) -> tuple[float, float]:
    """(output tokens per second, service CPU milliseconds per output token) of one round;
    `verify`: the CA file an HTTPS front door is checked against (bench/tls_bench.py)."""
    def client(c: int) -> int:
        n = 0
        with httpx.Client(base_url=stack.url, timeout=600, verify=verify) as http:
            for r in range(per_client):
                resp = http.post("/v1/completions", json={
                    "prompt": PROMPTS[(c + r) % len(PROMPTS)], "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True,
                    "speculation": {"mode": "on", "method": "ngram", "num_speculative_tokens": k}})
                resp.raise_for_status()
                n += resp.json()["usage"]["completion_tokens"]
        return n

    cpu, start = cpu_seconds(stack), time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(client, range(clients)))
    elapsed = time.perf_counter() - start
    return tokens / elapsed, (cpu_seconds(stack) - cpu) * 1000 / tokens


def scraper(urls: list[str], every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        for url in urls:
            try:
                httpx.get(url, timeout=5)
            except httpx.HTTPError:
                pass


def observer_costs(steps: int = 64, requests: int = 200) -> dict[str, float]:
    """Microseconds per engine step: the metrics observer, and spans from timelines."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prometheus_client import CollectorRegistry

    from verifier_service.telemetry.metrics import VerifierMetrics
    from verifier_service.telemetry.stats import (
        MethodStepStats,
        RequestTimeline,
        StepRecord,
        StepStats,
    )
    from verifier_service.telemetry.tracing import VerifierTracer

    out: dict[str, float] = {}
    metrics = VerifierMetrics(CollectorRegistry())
    step = StepStats(0.0, 0.01, 8, 40, 20, {
        "ngram": MethodStepStats(16, 9, 4, [4, 3, 1, 1], 0.002),
        "mlp": MethodStepStats(12, 7, 4, [4, 2, 1], 0.003)})
    n = 20000
    start = time.perf_counter()
    for _ in range(n):
        metrics.on_step(step)
    out["metrics on_step"] = (time.perf_counter() - start) / n * 1e6

    def timeline(i: int) -> RequestTimeline:
        t = 1000.0 + i
        return RequestTimeline(
            f"r{i}", "ngram", t, t + 0.001, t + 0.02, t + 0.02 + steps * 0.01, "length", 40,
            steps * 2, [StepRecord(t + 0.001, t + 0.02, 0, 0, 40)] + [
                StepRecord(t + 0.02 + j * 0.01, t + 0.03 + j * 0.01, 4, 1, 0, 0.002)
                for j in range(steps)])

    for detail in ("events", "spans"):
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter(),
                                                       max_queue_size=1 << 16))
        vt = VerifierTracer(provider.get_tracer("bench"), step_detail=detail)
        timelines = [timeline(i) for i in range(requests)]
        start = time.perf_counter()
        for tl in timelines:
            vt.begin(tl.request_id, "ngram", 4)
            vt.on_request_done(tl)
        out[f"spans, per-step {detail}"] = ((time.perf_counter() - start)
                                           / (requests * (steps + 1)) * 1e6)
        provider.shutdown()
    return out


def main() -> None:
    args = interleaved_parser(__doc__, concurrency=4).parse_args()
    if args.quick:
        args.rounds, args.blocks, args.max_tokens, args.requests_per_client = 3, 1, 24, 1
    out = Path(args.out or ROOT / ("bench/out/observability-quick.md" if args.quick
                                   else "bench/reports/observability.md"))
    micro = observer_costs()
    configs = ["off", "metrics", "traced"]
    results: dict[str, list[float]] = {c: [] for c in configs}
    cpu: dict[str, list[float]] = {c: [] for c in configs}
    spans = 0
    per_block = -(-args.rounds // args.blocks)
    with OtlpSink() as sink:
        envs = {"off": {}, "metrics": {},
                "traced": {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                           "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}}
        for block in range(args.blocks):
            # Fresh processes per block: how the OS happens to place a stack's processes
            # would otherwise favour one configuration for the whole run.
            stacks = {}
            stop = threading.Event()
            try:
                for c in configs:
                    config = StackConfig.with_free_ports(
                        model=args.model, device="cpu", log_dir=ROOT / f"bench/out/obs-logs/{c}",
                        verifier_args=["--threads", "1", "--proposer-timeout-ms", "2000"],
                        metrics_port=0 if c == "off" else None)
                    stacks[c] = BenchStack(config, envs[c])
                    stacks[c].start()
                urls = [u for c in ("metrics", "traced") for u in stacks[c].metrics_urls.values()]
                threading.Thread(target=scraper, args=(urls, 2.0, stop), daemon=True).start()
                for c in configs:  # warm-up round, not counted
                    run_round(stacks[c], args.concurrency, 1, 8, args.k)
                spans_before = len(sink.store.spans())
                for r in range(block * per_block, min(args.rounds, (block + 1) * per_block)):
                    order = configs[r % 3:] + configs[:r % 3]
                    for c in order:
                        tok_s, cpu_ms = run_round(stacks[c], args.concurrency,
                                                  args.requests_per_client, args.max_tokens,
                                                  args.k)
                        results[c].append(tok_s)
                        cpu[c].append(cpu_ms)
                    print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                        f"{c} {results[c][-1]:.1f} tok/s {cpu[c][-1]:.2f} cpu-ms/tok"
                        for c in configs), flush=True)
                time.sleep(1.0)  # the traced stack's last span batches
                spans += len(sink.store.spans()) - spans_before
            finally:
                stop.set()
                for st in stacks.values():
                    st.stop()

    def med(c):
        return statistics.median(results[c])

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(results[a], results[b]))

    def spread(a, b):
        """Interquartile range of the per-round ratios: the run's resolution."""
        q = statistics.quantiles([x / y for x, y in zip(results[a], results[b])], n=4)
        return f"{q[0]:.3f} to {q[2]:.3f}"

    metrics_ratio, traced_ratio = ratio("metrics", "off"), ratio("traced", "metrics")

    def cpu_med(c):
        return statistics.median(cpu[c])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "# Observability overhead", "",
        f"Target `{Path(args.model).name}`, n-gram speculation (k={args.k}), "
        f"{args.concurrency} concurrent clients x {args.requests_per_client} requests x "
        f"{args.max_tokens} greedy tokens per round, {args.rounds} rounds in {args.blocks} blocks "
        f"(fresh processes per block), three stacks interleaved with rotating order "
        f"({platform.machine()} CPU, {os.cpu_count()} cores, load average {load:.2f} at the "
        f"end). Metrics-on stacks are scraped every 2 s; the "
        f"traced stack exported {spans} spans to a local OTLP/gRPC sink. Produced by "
        f"`python bench/observability_bench.py{' --quick' if args.quick else ''}`.", "",
        "| configuration | tokens/s (median) | min | max | vs previous row (median of "
        "per-round ratios) | interquartile range of the ratios |",
        "|---|---:|---:|---:|---:|---:|",
        f"| off (no metrics, no tracing) | {med('off'):.1f} | {min(results['off']):.1f} | "
        f"{max(results['off']):.1f} | | |",
        f"| metrics on | {med('metrics'):.1f} | {min(results['metrics']):.1f} | "
        f"{max(results['metrics']):.1f} | {metrics_ratio:.3f} ({(metrics_ratio - 1) * 100:+.1f}%) "
        f"| {spread('metrics', 'off')} |",
        f"| metrics + tracing on | {med('traced'):.1f} | {min(results['traced']):.1f} | "
        f"{max(results['traced']):.1f} | {traced_ratio:.3f} ({(traced_ratio - 1) * 100:+.1f}%) "
        f"| {spread('traced', 'metrics')} |",
        "",
        "Service CPU time per output token (all three processes of a stack, from /proc; the "
        "OTLP receiver runs in the benchmark's own process and is not counted). It moves less "
        "with the machine's other load than tokens/s does, though contention still inflates "
        "it.", "",
        "| configuration | CPU ms per output token (median) | vs previous row |",
        "|---|---:|---:|",
        f"| off | {cpu_med('off'):.3f} | |",
        f"| metrics on | {cpu_med('metrics'):.3f} | "
        f"{(cpu_med('metrics') / cpu_med('off') - 1) * 100:+.1f}% |",
        f"| metrics + tracing on | {cpu_med('traced'):.3f} | "
        f"{(cpu_med('traced') / cpu_med('metrics') - 1) * 100:+.1f}% |", "",
        f"Budget: metrics within 2% of off ({'met' if metrics_ratio >= 0.98 else 'NOT met'}), "
        f"tracing within 5% of tracing off ({'met' if traced_ratio >= 0.95 else 'NOT met'}).",
        "", "## Verifier observers, in process", "",
        "| what | microseconds per engine step |", "|---|---:|",
        *(f"| {k} | {v:.2f} |" for k, v in micro.items()), "",
        f"Bound from these numbers, independent of the machine's noise: at {med('off'):.0f} "
        f"tokens/s ({1e6 / med('off'):.0f} us per output token) even one engine step per "
        f"token and sequence, each paying the exporter and the span events, would cost "
        f"{(micro['metrics on_step'] + micro['spans, per-step events']) * med('off') / 1e4:.2f}% "
        "of the time; the gateway and proposer add a few counters and one span per request "
        "and per Propose message.", "",
        "Per-step detail is recorded as span events: "
        + ("cheaper than child spans, as measured above."
           if micro["spans, per-step events"] <= micro["spans, per-step spans"]
           else "NOTE: child spans measured cheaper in this run."),
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
