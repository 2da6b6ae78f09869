"""Does `auto` keep up with the best fixed speculation setting? Output tokens/s through the real
services (gateway -> verifier -> proposers) at concurrency 1, 4 and 16, greedy and temperature
0.8, for speculation off, every served method at k = 3 and k = 5 (and, with --branches, its
token trees at its largest k), and auto.

    python bench/policy_bench.py [--rounds 3] [--max-tokens 64] [--branches ngram=3 ...]
                                 [--quick]

Per point (concurrency, temperature) the configurations are interleaved wave by wave: a wave
sends `concurrency` held-out prompts at once with one configuration and waits for all of them;
each configuration gets the same prompts. Throughput = output tokens / wall time of its waves.
Auto learns online from everything the verifier serves (the fixed configurations' drafts
included), as it would in a mixed deployment. The suffix proposer indexes every request it
serves, so in this benchmark it has seen each prompt before: it measures repeated traffic.
Reported per point: every configuration's tokens/s, the best fixed one, auto / best (target
>= 0.95), and what auto chose (method, k, reason).
Writes bench/reports/policy.md (--quick: bench/out/policy-quick.md).
"""

from __future__ import annotations

import asyncio
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import bench_parser  # noqa: E402
from spec_bench import held_out_prompts  # noqa: E402

from splitspec.launcher import Stack, StackConfig, sibling_proposer_models  # noqa: E402
from splitspec.methods import METHODS  # noqa: E402

TARGET = 0.95
Config = tuple[str, int, int]  # (method | "off" | "auto", k, children per node: 1 a chain)


def speculation(config: Config) -> dict:
    method, k, branches = config
    if method == "off":
        return {"mode": "off"}
    if method == "auto":
        return {"mode": "auto"}
    spec = {"mode": "on", "method": method, "num_speculative_tokens": k}
    return {**spec, "num_branches": branches} if branches > 1 else spec


def label(config: Config) -> str:
    if config[0] in ("off", "auto"):
        return config[0]
    return f"{config[0]} k={config[1]}" + (f" tree b={config[2]}" if config[2] > 1 else "")


async def wave(client: httpx.AsyncClient, prompts: list[str], config: Config,
               temperature: float, max_tokens: int) -> tuple[float, int, list[dict]]:
    """Send the prompts at once; (wall seconds, output tokens, usage.speculation of each)."""
    async def one(prompt: str) -> dict:
        r = await client.post("/v1/completions", json={
            "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
            "ignore_eos": True, "speculation": speculation(config)})
        r.raise_for_status()
        return r.json()["usage"]

    t0 = time.perf_counter()
    usages = await asyncio.gather(*(one(p) for p in prompts))
    return (time.perf_counter() - t0, sum(u["completion_tokens"] for u in usages),
            [u["speculation"] for u in usages])


MIN_REQUESTS = 6  # per configuration and point: more waves at low concurrency


def waves_for(concurrency: int, rounds: int) -> int:
    return max(rounds, -(-MIN_REQUESTS // concurrency))


async def run_point(url: str, prompts: Iterator[str], configs: list[Config], concurrency: int,
                    temperature: float, rounds: int, max_tokens: int) -> dict:
    """Waves of `concurrency` requests per configuration, interleaved, the order rotated each
    wave (what runs just before a configuration must not favour it); every request gets a
    prompt no configuration has seen (a cross-request proposer must not replay earlier
    configurations' outputs)."""
    seconds = {c: 0.0 for c in configs}
    tokens = {c: 0 for c in configs}
    chosen: Counter = Counter()
    trees: Counter = Counter()  # auto's requests that ran token trees, by method
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for r in range(waves_for(concurrency, rounds)):
            shift = r % len(configs)
            for config in configs[shift:] + configs[:shift]:
                batch = [next(prompts) for _ in range(concurrency)]
                s, n, specs = await wave(client, batch, config, temperature, max_tokens)
                seconds[config] += s
                tokens[config] += n
                if config[0] == "auto":
                    chosen.update((sp["method"] or "off", sp["num_speculative_tokens"],
                                   sp.get("policy_reason", "")) for sp in specs)
                    trees.update(sp["method"] for sp in specs if sp.get("num_branches", 1) > 1)
    return {"tps": {c: tokens[c] / seconds[c] for c in configs}, "chosen": chosen,
            "trees": trees}


def miss_reason(result: dict, best: Config) -> str:
    chosen = result["chosen"]
    top = ", ".join(f"{m}{f' k={k}' if k else ''} ({why}) x{n}"
                    for (m, k, why), n in chosen.most_common(3))
    return f"auto chose {top}; best fixed was {label(best)}"


def report(points: dict, configs: list[Config], args, methods: list[str]) -> str:
    fixed = [c for c in configs if c[0] != "auto"]
    lines = [
        "# The `auto` speculation policy vs fixed settings", "",
        f"Target `{Path(args.model).name}`; proposers: {', '.join(methods)}. Output tokens/s "
        f"through gateway -> verifier -> proposers on 127.0.0.1 ({platform.machine()} CPU, "
        f"{platform.python_version()}), {args.max_tokens} tokens per request (ignore_eos), "
        f"at least {args.rounds} wave(s) of `concurrency` requests (and at least {MIN_REQUESTS} "
        "requests) per configuration and point, configurations interleaved wave by wave in an "
        "order rotated every wave, one run. Every request has its own held-out prompt (cut "
        "from source files the models never trained on; none repeats in the run), so a "
        "cross-request proposer such as suffix never replays another configuration's output. "
        "Auto learns online from all traffic. "
        f"Target: auto >= {TARGET:.2f} x the best fixed configuration. Produced by "
        f"`python bench/policy_bench.py{' --quick' if args.quick else ''}`.", "",
        "| concurrency | temperature | " + " | ".join(label(c) for c in configs)
        + " | best fixed | auto / best | |",
        "|---:|---:|" + "---:|" * len(configs) + "---|---:|---|",
    ]
    misses = []
    for (conc, temp), res in points.items():
        tps = res["tps"]
        best = max(fixed, key=lambda c: tps[c])
        ratio = tps[("auto", 0, 1)] / tps[best]
        ok = ratio >= TARGET
        lines.append(f"| {conc} | {temp} | " + " | ".join(f"{tps[c]:.0f}" for c in configs)
                     + f" | {label(best)} | {ratio:.2f} | {'ok' if ok else 'MISS'} |")
        if not ok:
            misses.append(f"- concurrency {conc}, temperature {temp}: {ratio:.2f}; "
                          + miss_reason(res, best))
    lines += ["", "What auto chose (method, k, reason: requests):", ""]
    for (conc, temp), res in points.items():
        top = ", ".join(f"{m}{f' k={k}' if k else ''} {why}: {n}"
                        for (m, k, why), n in res["chosen"].most_common())
        trees = ", ".join(f"{m} x{n}" for m, n in res["trees"].most_common()) or "none"
        lines.append(f"- concurrency {conc}, temperature {temp}: {top}; as token trees: {trees}")
    lines += ["", "Misses:" if misses else "No misses.", "", *misses]
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--rounds", type=int, default=8,
                    help="waves per configuration and point (8: about 8 minutes on 2 idle cores)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.8])
    ap.add_argument("--k", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--branches", nargs="*", default=[],
                    help="METHOD=B: also the method's token trees of up to B children per node, "
                         "at the largest --k")
    ap.add_argument("--verifier-threads", type=int, default=0,
                    help="torch threads in the verifier and learned proposers (0: torch default)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 wave of 8 tokens per configuration and point")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.max_tokens = 1, 8
    out = Path(args.out or ROOT / ("bench/out/policy-quick.md" if args.quick
                                   else "bench/reports/policy.md"))
    branches = {m: int(b) for m, _, b in (x.partition("=") for x in args.branches)}
    configs_max = 2 + len(METHODS) * len(args.k) + len(branches)
    prompts = iter(held_out_prompts(configs_max * len(args.temperatures) * sum(
        c * waves_for(c, args.rounds) for c in args.concurrency)))
    models = sibling_proposer_models(args.model)
    threads = ["--threads", str(args.verifier_threads)] if args.verifier_threads else []
    config = StackConfig.with_free_ports(
        model=args.model, device="cpu", models=models,
        proposer_args={m: threads for m in models}, log_dir=ROOT / "bench/out/logs",
        verifier_args=["--proposer-timeout-ms", "2000", "--threads", str(args.verifier_threads),
                       "--max-num-seqs", str(max(args.concurrency))])
    points: dict = {}
    with Stack(config) as stack:
        methods = httpx.get(stack.url + "/v1/models", timeout=60).json()["data"][0][
            "speculation_methods"]
        configs = ([("off", 0, 1)] + [(m, k, 1) for m in methods for k in args.k]
                   + [(m, max(args.k), b) for m, b in branches.items() if m in methods]
                   + [("auto", 0, 1)])
        for conc in args.concurrency:
            for temp in args.temperatures:
                t0 = time.perf_counter()
                points[(conc, temp)] = asyncio.run(run_point(
                    stack.url, prompts, configs, conc, temp, args.rounds, args.max_tokens))
                print(f"concurrency {conc}, temperature {temp}: "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
    text = report(points, configs, args, methods)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
