"""Verifier engine throughput at several concurrencies (continuous batching), in-process, for
speculation off and, optionally, in-target methods beside it.

    python bench/engine_bench.py [--model DIR] [--concurrency 1 4 16 32] [--tokens 64]
                                 [--configs off eagle:3 eagle:5] [--eagle DIR]
                                 [--temperature T]

For each concurrency C, one engine serves every configuration: a wave is C clients each sending
one request (greedy, or sampled at --temperature; ignore_eos, a fixed number of output tokens)
of one configuration, and `--requests-per-client` waves per configuration run interleaved, the
order reversed every round (the machine is shared and noisy: compare ratios within a
concurrency, not absolute times across runs). Reported: output tokens/s, each configuration
against the first (off) at the same concurrency, tokens per engine step (a batch's), mean time
per output token seen by a client, and off's throughput relative to C=1. `eagle:K` runs the
EAGLE head (`--eagle`, default the target's directory + `-eagle`) with chains of K tokens
(greedy, or drawn from the head's q). Writes bench/reports/engine.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_common import bench_parser, markdown_table, write_markdown  # noqa: E402

from splitspec.params import GenerationInput, SamplingParams, SpeculationPlan, StoppingCriteria  # noqa: E402
from verifier_service.config import VerifierConfig  # noqa: E402
from verifier_service.server import build_engine  # noqa: E402

PROMPTS = ["def fibonacci(n):\n", "import json\n\nclass Config:\n", "for line in sys.stdin:\n",
           "    def __repr__(self):\n", "if __name__ == '__main__':\n"]


def parse_config(text: str) -> SpeculationPlan:
    """off, or METHOD:K (an in-target method the engine serves, chains of K)."""
    if text == "off":
        return SpeculationPlan()
    method, _, k = text.partition(":")
    return SpeculationPlan(method=method, k=int(k or 3))


async def run_level(model: str, eagle: str, concurrency: int, rounds: int, tokens: int,
                    configs: list[str], threads: int, temperature: float = 0.0
                    ) -> dict[str, dict]:
    config = dataclasses.replace(VerifierConfig(model=model, threads=threads, eagle=eagle),
                                 max_num_seqs=max(concurrency, 1))
    engine, *_ = build_engine(config, {})
    engine.start()
    ids = [tuple(engine.tokenizer.encode(p)) for p in PROMPTS]
    plans = {name: parse_config(name) for name in configs}
    totals = {name: dict(tokens=0, seconds=0.0, steps=0, per_token=[]) for name in configs}

    async def client(c: int, r: int, name: str, max_tokens: int, record: bool):
        inp = GenerationInput(f"{name}-c{c}r{r}", ids[(c + r) % len(ids)],
                              SamplingParams(temperature=temperature),
                              StoppingCriteria(max_tokens=max_tokens, ignore_eos=True),
                              plans[name])
        t0 = time.perf_counter()
        n = 0
        async for out in engine.generate(inp):
            n += len(out.token_ids)
        if record:
            totals[name]["per_token"].append((time.perf_counter() - t0) / max(n, 1))

    for name in configs:  # warm-up: one short request of each
        await client(0, -1, name, 4, False)
    for r in range(rounds):
        for name in (configs if r % 2 == 0 else configs[::-1]):
            steps0, gen0 = engine.stats.steps, engine.stats.generated_tokens
            t0 = time.perf_counter()
            await asyncio.gather(*(client(c, r, name, tokens, True) for c in range(concurrency)))
            t = totals[name]
            t["seconds"] += time.perf_counter() - t0
            t["tokens"] += engine.stats.generated_tokens - gen0
            t["steps"] += engine.stats.steps - steps0
    await engine.shutdown()
    return totals


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--configs", nargs="+", default=["off"],
                    help="off, or METHOD:K of an in-target method (eagle:3); the first is the "
                         "baseline")
    ap.add_argument("--eagle", default=None, help="the EAGLE head (default: MODEL-eagle)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature of every request (0: greedy)")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/engine.md"))
    args = ap.parse_args()
    wants_eagle = any(c.startswith("eagle") for c in args.configs)
    eagle = (args.eagle or f"{args.model.rstrip('/')}-eagle") if wants_eagle else ""
    levels = {c: asyncio.run(run_level(args.model, eagle, c, args.requests_per_client,
                                       args.tokens, args.configs, args.threads,
                                       args.temperature))
              for c in args.concurrency}
    base_name = args.configs[0]
    base = levels[args.concurrency[0]][base_name]
    lines = [
        f"# Verifier engine throughput ({', '.join(args.configs)})", "",
        f"Model `{Path(args.model).name}`"
        + (f", EAGLE head `{Path(eagle).name}`" if eagle else "")
        + f", {args.tokens} output tokens per request, {args.requests_per_client} waves per "
        f"configuration and concurrency (interleaved), "
        + (f"temperature {args.temperature}" if args.temperature else "greedy")
        + ", in-process engine (no gRPC). "
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}. Produced by `python bench/engine_bench.py "
        f"{' '.join(sys.argv[1:])}`.", "",
    ]
    rows = []
    for c, totals in levels.items():
        ref = totals[base_name]["tokens"] / totals[base_name]["seconds"]
        for name, t in totals.items():
            tok_s = t["tokens"] / t["seconds"]
            scale = (f"{tok_s / (base['tokens'] / base['seconds']):.2f}" if name == base_name
                     else "")
            rows.append([c, name, t["tokens"], f"{t['seconds']:.2f}", f"{tok_s:.1f}",
                         f"{tok_s / ref:.2f}", f"{t['tokens'] / max(t['steps'], 1):.2f}",
                         f"{1000 * sum(t['per_token']) / max(len(t['per_token']), 1):.2f}", scale])
    columns = {"concurrency": "r", "configuration": "l", "output tokens": "r", "seconds": "r",
               "tokens/s": "r", f"x {base_name}": "r", "tokens / engine step": "r",
               "ms/token per client": "r", f"{base_name} x vs C={args.concurrency[0]}": "r"}
    write_markdown(args.out, lines + markdown_table(columns, rows))


if __name__ == "__main__":
    main()
