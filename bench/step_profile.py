"""Where a decode step's host time goes (`make bench-step-profile`): the verifier's engine in
this process, its model thread run inline on the event loop's thread so one profiler sees
the whole step, for speculation off and the in-target methods (EAGLE chains and trees,
lookahead), which need no proposer service.

    python3 bench/step_profile.py --device cuda --out bench/reports/step-profile.md
    python3 bench/step_profile.py --device cpu --quick --out /tmp/step-profile.md

Per configuration: milliseconds per decode step (mean over the profiled requests, after a
warm-up), tokens per step, then the functions with the most time of their own per step
(cProfile). On a device, the step's one wait on the device shows as the event wait (or the
copy out it guards): what is left is host work that does not overlap the device. The
proposer services' round trip and proposing are not in it (`make bench-gpu` splits those).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import device_dtype, device_parser, write_markdown  # noqa: E402
from compare_bench import machine_facts  # noqa: E402
from spec_bench import held_out_prompts  # noqa: E402

from splitspec.params import (  # noqa: E402
    GenerationInput,
    SamplingParams,
    SpeculationPlan,
    StoppingCriteria,
)


class Inline(cf.Executor):
    """Runs the engine's model-thread work where it is submitted: one thread, one profile."""

    def submit(self, fn, *args, **kwargs):
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting step
            future.set_exception(exc)
        return future


GREEDY, SEEDED = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=7)


def plans(eagle: bool, quick: bool) -> list[tuple[str, SpeculationPlan, SamplingParams]]:
    out = [("off", SpeculationPlan(), GREEDY), ("off, T 0.8 seeded", SpeculationPlan(), SEEDED)]
    if eagle:
        out += [("eagle k=3", SpeculationPlan("eagle", 3), GREEDY)]
        if not quick:
            out += [("eagle k=3, T 0.8 seeded", SpeculationPlan("eagle", 3), SEEDED),
                    ("eagle k=5", SpeculationPlan("eagle", 5), GREEDY),
                    ("eagle k=8 tree b=4", SpeculationPlan("eagle", 8, num_branches=4), GREEDY)]
    out += [("lookahead k=10", SpeculationPlan("lookahead", 10), GREEDY)]
    return out


def profile_lines(stats: pstats.Stats, steps: int, top: int) -> list[str]:
    """The functions with the most time of their own per step; then the project's own
    functions by time spent inside them (callees included): the step's phases."""
    def row(key, calls, ms) -> str:
        path, line, name = key
        where = path.replace(str(ROOT) + "/", "") if path != "~" else ""
        return (f"| {ms / steps:.3f} | {calls / steps:.1f} | "
                f"`{name}` {where}{':' + str(line) if where else ''} |")

    items = stats.stats.items()
    own = sorted(items, key=lambda kv: kv[1][2], reverse=True)[:top]
    lines = ["| own ms / step | calls / step | function |", "|---:|---:|---|"]
    lines += [row(key, calls, 1000 * t) for key, (_, calls, t, _, _) in own]
    ours = [kv for kv in items if kv[0][0].startswith(str(ROOT)) and "/bench/" not in kv[0][0]]
    inside = sorted(ours, key=lambda kv: kv[1][3], reverse=True)[:top]
    lines += ["", "| ms / step inside (callees included) | calls / step | function |",
              "|---:|---:|---|"]
    lines += [row(key, calls, 1000 * t) for key, (_, calls, _, t, _) in inside]
    return lines


async def generate(engine, rid: str, ids: tuple[int, ...], plan: SpeculationPlan,
                   sampling: SamplingParams, tokens: int) -> int:
    inp = GenerationInput(rid, ids, sampling,
                          StoppingCriteria(max_tokens=tokens, ignore_eos=True), plan)
    n = 0
    async for out in engine.generate(inp):
        n += len(out.token_ids)
    return n


def main() -> None:
    ap = device_parser(__doc__)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--quick", action="store_true",
                    help="off (greedy, sampled), EAGLE k 3 and lookahead only")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/step-profile.md"))
    args = ap.parse_args()
    args.dtype = device_dtype(args)

    from verifier_service.config import VerifierConfig
    from verifier_service.server import build_engine
    from verifier_service.step.warmup import warm_up

    head = Path(f"{args.model}-eagle")
    eagle = str(head) if (head / "config.json").exists() else ""
    engine, *_ = build_engine(VerifierConfig(model=args.model, device=args.device,
                                             dtype=args.dtype, max_num_seqs=4,
                                             max_num_speculative_tokens=10, eagle=eagle), {})
    engine._executor = Inline()
    prompts = [tuple(engine.tokenizer.encode(p, add_special_tokens=False))
               for p in held_out_prompts(args.prompts)]
    lines = ["# Where a decode step's host time goes", "",
             f"`python3 bench/step_profile.py {' '.join(sys.argv[1:])}`".rstrip(), "",
             "| machine | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in machine_facts(0, 0).items()]
    lines += [f"| device | {engine.runner.device}, {args.dtype} |", ""]

    async def run() -> None:
        engine.start()
        await warm_up(engine)
        try:
            for label, plan, sampling in plans(bool(eagle), args.quick):
                for i, ids in enumerate(prompts[:2]):  # this configuration's shapes, warm
                    await generate(engine, f"warm-{label}-{i}", ids, plan, sampling,
                                   args.tokens)
                steps0, seconds0 = engine.stats.steps, engine.stats.step_seconds_total
                profiler, emitted, t0 = cProfile.Profile(), 0, time.perf_counter()
                profiler.enable()
                for i, ids in enumerate(prompts):
                    emitted += await generate(engine, f"{label}-{i}", ids, plan, sampling,
                                              args.tokens)
                profiler.disable()
                wall = time.perf_counter() - t0
                steps = engine.stats.steps - steps0  # the prefill steps included: few
                per_step = 1000 * (engine.stats.step_seconds_total - seconds0) / steps
                lines.extend([f"## {label}", "",
                              f"- {steps} steps, {per_step:.2f} ms per step, "
                              f"{emitted / steps:.2f} tokens per step, "
                              f"{emitted / wall:.1f} tok/s (profiler on)", ""])
                lines.extend(profile_lines(pstats.Stats(profiler), steps, args.top) + [""])
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text("\n".join(lines) + "\n")  # a run cut short keeps it
                print(f"[{time.strftime('%H:%M:%S')}] {label}: {per_step:.2f} ms per step",
                      flush=True)
        finally:
            await engine.shutdown()

    asyncio.run(run())
    stats = engine.executor.stats
    lines += [f"- steps replayed as graphs: {stats.captured_steps}", ""]
    write_markdown(args.out, lines)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
