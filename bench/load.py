"""Load curves through the OpenAI chat endpoint, driven by locust (`make bench-load`,
bench/reports/load.md and its plots).

    python bench/load.py [--model DIR] [--concurrency 1 4 16 64] [--rates 1 2 4]
        [--requests 4] [--max-tokens 64] [--ours off pld auto] [--llama plain draft]
        [--locust locust] [--out bench/reports/load.md]

The load generator is locust (the `bench` extra; --locust names another executable), headless,
one run per level with bench/load_locustfile.py's user: every request streams one greedy chat
completion of a Spec-Bench question (bench/specbench_data.py, cycled) and records its time to
the first token, its end and its output tokens. Two sweeps per system, each system in a
process of its own started for it:
  * concurrency: C users at once, each sending its next request when its last one ended
    (closed loop), max(C, --requests) requests per level, rounded up to whole passes over the
    questions (every level the same prompt mix);
  * request rate: request i sent at i / R seconds (open loop, one user per request, whatever
    the ones before it are doing), --rate-requests per level.
Systems: the project (its stack, bench/specbench.py's launcher) with off, its best fixed
configuration (--ours, keys of bench/peers.py's table) and auto; llama-server plain and with
its best speculation (--llama, keys of bench/peers.py's table; after `make llama-server`).

Reported per level: output tokens/s (all requests' output tokens over the level's wall time,
first request sent to last one ended), time to the first token and time per output token
((end - first token) / (tokens - 1)) at p50 and p99, and errors (non-200 answers, broken
streams, an error event). Plots: throughput against concurrency; p99 time per output token
against throughput. Goals: 0 errors at 64 clients; auto's p99 TPOT at 64 no worse than off's;
auto at least 0.95x the best fixed configuration at every concurrency.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402
from bench_common import bench_parser  # noqa: E402
from specbench_data import GROUPS, QUESTIONS, load, pick  # noqa: E402

LOCUSTFILE = ROOT / "bench/load_locustfile.py"
LOGS = ROOT / "bench/out/logs/load"
AUTO_LABEL = "splitspec auto"


@dataclass
class Level:
    kind: str  # "concurrency" or "rate"
    value: float  # clients, or requests per second
    records: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> list[dict]:
        return [r for r in self.records if not r.get("error")]

    @property
    def errors(self) -> int:
        return len(self.records) - len(self.ok)

    @property
    def throughput(self) -> float:
        """Output tokens per second over the level's wall time."""
        if not self.records:
            return 0.0
        wall = max(r["end"] for r in self.records) - min(r["start"] for r in self.records)
        return sum(r["tokens"] for r in self.ok) / wall if wall > 0 else 0.0

    def ttft(self) -> list[float]:
        return [r["first"] - r["start"] for r in self.ok if r.get("first")]

    def tpot(self) -> list[float]:
        return [(r["end"] - r["first"]) / (r["tokens"] - 1) for r in self.ok
                if r.get("first") and r["tokens"] > 1]


@dataclass
class System:
    label: str
    levels: list[Level] = field(default_factory=list)
    skipped: str = ""

    def at(self, kind: str, value: float) -> Level | None:
        return next((lv for lv in self.levels if lv.kind == kind and lv.value == value), None)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), nearest rank."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


# -- driving locust -------------------------------------------------------------------------------

def locust_command(args) -> list[str] | None:
    """How to start locust: --locust, else this interpreter's module, else none."""
    if args.locust:
        return [args.locust]
    import importlib.util

    if importlib.util.find_spec("locust") is not None:
        return [sys.executable, "-m", "locust"]
    found = shutil.which("locust")
    return [found] if found else None


def run_level(command: list[str], port: int, prompts_file: Path, level: Level, requests: int,
              max_tokens: int, extra: dict, timeout_s: float) -> Level:
    """One locust run at one level; its records."""
    with tempfile.TemporaryDirectory() as tmp:
        records = Path(tmp) / "records.jsonl"
        if level.kind == "concurrency":
            users, rate = int(level.value), 0.0
        else:  # open loop: one user per request, each sent at its arrival time
            users, rate = requests, level.value
        env = {**os.environ, "LOAD_PROMPTS": str(prompts_file), "LOAD_REQUESTS": str(requests),
               "LOAD_RATE": str(rate), "LOAD_MAX_TOKENS": str(max_tokens),
               "LOAD_EXTRA": json.dumps(extra), "LOAD_RECORDS": str(records)}
        LOGS.mkdir(parents=True, exist_ok=True)
        with open(LOGS / "locust.log", "a") as log:
            try:
                subprocess.run([*command, "-f", str(LOCUSTFILE), "--headless", "--only-summary",
                                "--host", f"http://127.0.0.1:{port}", "-u", str(users), "-r",
                                str(users), "-t", f"{int(timeout_s)}s", "--stop-timeout", "5",
                                "--loglevel", "WARNING"], env=env, check=False,
                               timeout=timeout_s + 30, stdout=log, stderr=log)
            except subprocess.TimeoutExpired:
                pass  # what it recorded counts; the rest are errors (not answered in time)
        if records.exists():
            level.records = [json.loads(line) for line in records.read_text().splitlines()
                             if line.strip()]
    missing = requests - len(level.records)
    level.records += [{"start": 0, "first": None, "end": 0, "tokens": 0,
                       "error": "not answered in time"}] * max(missing, 0)
    return level


def level_requests(wanted: int, n_prompts: int) -> int:
    """Requests a level sends: at least `wanted`, a whole number of passes over the prompts,
    so that every level has the same prompt mix (long prompts' prefill is not only at the
    levels large enough to reach them)."""
    return n_prompts * max(1, math.ceil(wanted / n_prompts))


def sweep(args, command: list[str], port: int, prompts_file: Path, extra: dict) -> list[Level]:
    levels = []
    n_prompts = len(json.loads(prompts_file.read_text()))
    for c in args.concurrency:
        print(f"[load]   concurrency {c}", flush=True)
        levels.append(run_level(command, port, prompts_file, Level("concurrency", c),
                                level_requests(max(c, args.requests), n_prompts),
                                args.max_tokens, extra, args.timeout))
    for r in args.rates:
        print(f"[load]   rate {r}/s", flush=True)
        levels.append(run_level(command, port, prompts_file, Level("rate", r),
                                level_requests(args.rate_requests, n_prompts),
                                args.max_tokens, extra, args.timeout))
    return levels


def run_ours(args, command, prompts_file) -> list[System]:
    from specbench import missing_models, stack_config

    from splitspec.launcher import Stack, sibling_proposer_models

    models = sibling_proposer_models(args.model)
    args.proposer_threads = args.threads
    out = []
    for cfg in [c for c in peers.OURS if c.key in args.ours]:
        if cfg.key == "auto":
            cfg = dataclasses.replace(cfg, methods=tuple(args.auto_methods))
        if (missing := missing_models(cfg, models)):
            out.append(System(cfg.label, skipped=f"no model beside the target for {missing}"))
            continue
        print(f"[load] {cfg.label}", flush=True)
        stack = Stack(stack_config(args, cfg, models))
        stack.start()
        try:
            peers.wait_ready(stack.config.http_port)
            out.append(System(cfg.label, sweep(args, command, stack.config.http_port,
                                               prompts_file, {"speculation": cfg.speculation})))
        finally:
            stack.stop()
    return out


def run_llama(args, command, prompts_file) -> list[System]:
    chosen = [c for c in peers.LLAMA if c.key in args.llama]
    binary = peers.llama_cpp.server_binary()
    if binary is None:
        return [System(c.label, skipped="llama-server not built (make llama-server)")
                for c in chosen]
    gguf = peers.llama_cpp.f16_gguf(args.model)
    draft = (peers.llama_cpp.f16_gguf(args.draft) if any(c.needs_draft for c in chosen)
             else None)
    out = []
    for cfg in chosen:
        # one slot per client at the largest concurrency, as the project batches them all
        server = peers.LlamaServer(binary, gguf, draft, cfg, args.threads,
                                   args.ctx * max(args.concurrency),
                                   ROOT / f"bench/out/logs/load/llama-{cfg.key}.log")
        server.argv[server.argv.index("-np") + 1] = str(max(args.concurrency))
        print(f"[load] {cfg.label}", flush=True)
        with server:
            out.append(System(cfg.label, sweep(args, command, server.port, prompts_file, {})))
    return out


# -- the report -----------------------------------------------------------------------------------

def ms(v: float | None) -> str:
    return f"{v * 1000:.0f}" if v is not None else "-"


def plots(systems: list[System], out_dir: Path, stem: str) -> list[Path]:
    """Throughput against concurrency; p99 time per output token against throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for s in systems:
        pts = sorted((lv.value, lv.throughput) for lv in s.levels if lv.kind == "concurrency")
        if pts:
            ax.plot(*zip(*pts), marker="o", label=s.label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput against concurrency")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / f"{stem}-throughput.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for s in systems:
        pts = sorted((lv.throughput, percentile(lv.tpot(), 99) * 1000) for lv in s.levels
                     if lv.tpot())
        if pts:
            ax.plot(*zip(*pts), marker="o", linestyle="", label=s.label)
    ax.set_xlabel("output tokens/s")
    ax.set_ylabel("p99 time per output token (ms)")
    ax.set_title("p99 TPOT against throughput (every level)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / f"{stem}-tpot.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def goals(systems: list[System], concurrency: list[int], fixed_labels: list[str]) -> list[str]:
    by = {s.label: s for s in systems if s.levels}
    auto, off = by.get(AUTO_LABEL), by.get(peers.OFF)
    top = max(concurrency)
    lines = ["| goal | measured | |", "|---|---|---|"]
    errs = {s.label: s.at("concurrency", top).errors for s in by.values()
            if s.at("concurrency", top)}
    if errs:
        worst = max(errs.values())
        lines.append(f"| 0 errors at {top} concurrent clients | "
                     + ", ".join(f"{k}: {v}" for k, v in errs.items())
                     + f" | {'met' if worst == 0 else 'MISSED'} |")
    a_lv = auto.at("concurrency", top) if auto else None
    o_lv = off.at("concurrency", top) if off else None
    a99 = percentile(a_lv.tpot(), 99) if a_lv else None
    o99 = percentile(o_lv.tpot(), 99) if o_lv else None
    if a99 is not None and o99 is not None:
        lines.append(f"| auto's p99 TPOT at {top} no worse than off's | {ms(a99)} ms against "
                     f"{ms(o99)} ms | {'met' if a99 <= o99 else 'MISSED'} |")
    else:
        lines.append(f"| auto's p99 TPOT at {top} no worse than off's | not measured | - |")
    fixed = [by[f] for f in fixed_labels if f in by]
    for c in concurrency:
        a = auto.at("concurrency", c) if auto else None
        best = max((s.at("concurrency", c) for s in fixed if s.at("concurrency", c)),
                   key=lambda lv: lv.throughput, default=None)
        if a is None or best is None or best.throughput <= 0:
            lines.append(f"| auto >= 0.95x the best fixed configuration at {c} | not measured "
                         "| - |")
            continue
        ratio = a.throughput / best.throughput
        lines.append(f"| auto >= 0.95x the best fixed configuration at {c} | {ratio:.2f}x | "
                     f"{'met' if ratio >= 0.95 else 'MISSED'} |")
    return lines


def render(systems: list[System], args, command: str, images: list[Path]) -> str:
    fixed = [c.label for c in peers.OURS if c.key in args.ours and c.key not in ("off", "auto")]
    lines = ["# Load: throughput and latency under concurrent clients", "",
             *([args.note, ""] if getattr(args, "note", None) else []),
             f"Command: `{command}`", "",
             f"Driven by locust (bench/load_locustfile.py), greedy chat completions of Spec-Bench "
             f"questions, streamed, at most {args.max_tokens} new tokens each, {args.threads} "
             "thread(s) per engine. Concurrency levels are closed loops (each client sends its "
             "next request when its last one ended); rate levels open loops (one client per "
             "request, spawned at the rate). Throughput: output tokens over the level's wall "
             "time. TTFT: time to the first token; TPOT: (end - first token) / (tokens - 1).",
             "", "| system | level | requests | errors | output tok/s | TTFT p50 ms | "
             "TTFT p99 ms | TPOT p50 ms | TPOT p99 ms |", "|---|---|---:|---:|---:|---:|---:|"
             "---:|---:|"]
    for s in systems:
        for lv in s.levels:
            level = (f"{lv.value:g} clients" if lv.kind == "concurrency"
                     else f"{lv.value:g} req/s")
            ttft, tpot = lv.ttft(), lv.tpot()
            lines.append(f"| {s.label} | {level} | {len(lv.records)} | {lv.errors} | "
                         f"{lv.throughput:.1f} | {ms(percentile(ttft, 50))} | "
                         f"{ms(percentile(ttft, 99))} | {ms(percentile(tpot, 50))} | "
                         f"{ms(percentile(tpot, 99))} |")
    skipped = [s for s in systems if s.skipped]
    if skipped:
        lines += ["", "Not measured:", ""] + [f"- {s.label}: {s.skipped}" for s in skipped]
    lines += ["", "## Goals", "", *goals(systems, args.concurrency, fixed), ""]
    for img in images:
        lines += [f"![{img.stem}]({img.name})", ""]
    return "\n".join(lines) + "\n"


def parser():
    ap = bench_parser(__doc__)
    ap.set_defaults(model=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--draft", default=None,
                    help="llama-server's draft model (default: the target's -draft sibling)")
    ap.add_argument("--questions", default=str(QUESTIONS))
    ap.add_argument("--per-group", type=int, default=1, help="questions per group, cycled")
    ap.add_argument("--max-chars", type=int, default=None,
                    help="cut each question to N characters (a target with a short context)")
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 4, 16, 64])
    ap.add_argument("--requests", type=int, default=4,
                    help="requests per concurrency level at least (a level of C sends max(C, "
                         "this))")
    ap.add_argument("--rates", type=float, nargs="*", default=[1.0, 2.0, 4.0],
                    help="requests per second of the open-loop sweep")
    ap.add_argument("--rate-requests", type=int, default=8, help="requests per rate level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="per engine, equal for all")
    ap.add_argument("--ctx", type=int, default=2048, help="llama-server's context per slot")
    ap.add_argument("--ours", nargs="*", default=["off", "pld", "auto"],
                    help="the project's configurations (bench/peers.py): "
                         + " ".join(c.key for c in peers.OURS))
    ap.add_argument("--auto-methods", nargs="+", default=["ngram", "suffix", "draft"])
    ap.add_argument("--llama", nargs="*", default=["plain", "draft"],
                    help="llama-server configurations (bench/peers.py): "
                         + " ".join(c.key for c in peers.LLAMA))
    ap.add_argument("--max-k", type=int, default=10)
    ap.add_argument("--locust", default=None, help="the locust executable (default: this "
                    "interpreter's locust module, else locust on PATH)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per level at most")
    ap.add_argument("--note", default=None, help="a line under the report's title (e.g. where "
                    "and how it was measured)")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/load.md"))
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if args.draft is None:
        args.draft = str(Path(args.model).with_name(Path(args.model).name + "-draft"))
    command = locust_command(args)
    if command is None:
        raise SystemExit("[load] locust is missing: pip install -e '.[bench]' (or --locust PATH)")
    questions = pick(load(args.questions), args.per_group, tuple(GROUPS))
    cut = (lambda t: t[:args.max_chars]) if args.max_chars else (lambda t: t)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        prompts_file = Path(tmp) / "prompts.json"
        prompts_file.write_text(json.dumps([[{"role": "user", "content": cut(q.turns[0])}]
                                            for q in questions]))
        started = time.perf_counter()
        systems = run_ours(args, command, prompts_file) + run_llama(args, command, prompts_file)
    images = plots([s for s in systems if s.levels], out.parent, out.stem)
    cmd = "python bench/load.py " + " ".join(argv if argv is not None else sys.argv[1:])
    report = render(systems, args, cmd, images)
    out.write_text(report)
    print(report, f"[load] {time.perf_counter() - started:.0f} s", flush=True)
    return {"systems": systems, "report": report, "images": images}


if __name__ == "__main__":
    main()
