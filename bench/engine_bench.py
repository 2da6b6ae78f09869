"""Verifier engine throughput at several concurrencies (continuous batching), in-process.

    python bench/engine_bench.py [--model DIR] [--concurrency 1 4 16 32] [--tokens 64]

For each concurrency C, C clients each send requests back to back (greedy, ignore_eos, a fixed
number of output tokens) for `--requests-per-client` rounds. Reported: output tokens/s, mean
time per output token seen by a client, engine steps, and throughput relative to C=1 measured in
the same run (the machine is shared and noisy: compare ratios, not absolute times across runs).
Writes bench/reports/engine.md.
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

from bench_common import bench_parser, write_markdown  # noqa: E402

from splitspec.params import GenerationInput, SamplingParams, SpeculationPlan, StoppingCriteria  # noqa: E402
from verifier_service.config import VerifierConfig  # noqa: E402
from verifier_service.server import build_engine  # noqa: E402

PROMPTS = ["def fibonacci(n):\n", "import json\n\nclass Config:\n", "for line in sys.stdin:\n",
           "    def __repr__(self):\n", "if __name__ == '__main__':\n"]


async def run_level(model: str, concurrency: int, rounds: int, tokens: int, plan: SpeculationPlan,
                    threads: int):
    config = dataclasses.replace(VerifierConfig(model=model, threads=threads),
                                 max_num_seqs=max(concurrency, 1))
    engine, *_ = build_engine(config, {})
    engine.start()
    ids = [tuple(engine.tokenizer.encode(p)) for p in PROMPTS]
    per_token: list[float] = []

    async def client(c: int):
        for r in range(rounds):
            inp = GenerationInput(f"c{c}r{r}", ids[(c + r) % len(ids)],
                                  SamplingParams(temperature=0.0),
                                  StoppingCriteria(max_tokens=tokens, ignore_eos=True), plan)
            t0 = time.perf_counter()
            n = 0
            async for out in engine.generate(inp):
                n += len(out.token_ids)
            per_token.append((time.perf_counter() - t0) / max(n, 1))

    # warm-up: one short request
    async for _ in engine.generate(GenerationInput("warm", ids[0], SamplingParams(temperature=0.0),
                                                   StoppingCriteria(max_tokens=4), plan)):
        pass
    steps0, gen0 = engine.stats.steps, engine.stats.generated_tokens
    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(concurrency)))
    elapsed = time.perf_counter() - t0
    generated = engine.stats.generated_tokens - gen0
    steps = engine.stats.steps - steps0
    await engine.shutdown()
    return dict(concurrency=concurrency, tokens=generated, seconds=elapsed,
                tok_s=generated / elapsed, ms_per_token=1000 * sum(per_token) / len(per_token),
                steps=steps)


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/engine.md"))
    args = ap.parse_args()
    rows = [asyncio.run(run_level(args.model, c, args.requests_per_client, args.tokens,
                                  SpeculationPlan(), args.threads))
            for c in args.concurrency]
    base = rows[0]["tok_s"]
    lines = [
        "# Verifier engine throughput (speculation off)", "",
        f"Model `{Path(args.model).name}`, {args.tokens} output tokens per request, "
        f"{args.requests_per_client} requests per client, greedy, in-process engine "
        f"(no gRPC). Machine: {platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}. Produced by `python bench/engine_bench.py`.", "",
        "| concurrency | output tokens | seconds | tokens/s | x vs C=1 | ms/token per client "
        "| steps |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['concurrency']} | {r['tokens']} | {r['seconds']:.2f} | "
                     f"{r['tok_s']:.1f} | {r['tok_s'] / base:.2f} | {r['ms_per_token']:.2f} | "
                     f"{r['steps']} |")
    write_markdown(args.out, lines)


if __name__ == "__main__":
    main()
