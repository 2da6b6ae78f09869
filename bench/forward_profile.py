"""Where the verifier's forward spends its time, for the comparison report: the target's paged
forward (verifier_service.model.runner) in this process, one decode row and one verification of
k + 1 rows over a cached prompt, timed per matmul backend (kernels/linear.py); the default
backend's cost for every row count up to 13 (the shape of the curve a verification pays: on
a CPU it climbs in steps, one more pass over the weights per micro-kernel tile of rows, see
bench/reports/2026-history-performance.md); and the torch profiler's top operators for the
default backend.

    python bench/forward_profile.py            # prints the markdown section
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from splitspec.config import DEFAULT_MODEL  # noqa: E402

CONTEXT = 150  # cached tokens before the timed rows
MAX_ROWS = 13  # the rows sweep's widest forward
BLOCK = 16


def _runner(model_dir: str, linear: str):
    import torch

    from splitspec.modelio import load_causal_lm
    from verifier_service.kv.cache import KVCacheSpec, PagedKVCache
    from verifier_service.kv.paged_attention import ATTENTION_NAME, register
    from verifier_service.model.runner import ModelRunner

    register()
    device = torch.device("cpu")
    model = load_causal_lm(model_dir, device, torch.float32, attn_implementation=ATTENTION_NAME)
    # blocks for every table the section holds at once (each step function keeps its own):
    # two per backend and the rows sweep's, at the longest context it lays out
    tables = 2 + MAX_ROWS
    per_table = -(-(CONTEXT + MAX_ROWS) // BLOCK)
    kv = PagedKVCache(KVCacheSpec.for_model(model.config, torch.float32, BLOCK, 0,
                                            num_blocks=tables * per_table), device)
    return ModelRunner(model, device, kv, linear=linear)


def _steps(runner, context: int, rows: int):
    """A function running one forward of `rows` rows after `context` cached tokens."""
    from kernels.layout import StepLayout
    from verifier_service.kv.cache import BlockTable

    table = BlockTable()
    runner.kv.reserve(table, context + rows)
    ids = [3 + i % 1000 for i in range(context + rows)]
    runner.forward(ids[:context], [table], StepLayout.build([context], [0], [0], [True]))
    layout = StepLayout.build([rows], [context], [rows - 1], [True])
    return lambda: runner.forward(ids[context:], [table], layout)


def _best_ms(fn, repeats: int = 30, rounds: int = 5) -> float:
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best * 1000


def rows_sweep(runner, context: int, max_rows: int = MAX_ROWS, rounds: int = 15) -> list[float]:
    """Median ms of a forward of 1..max_rows rows after `context` cached tokens, the row counts
    interleaved round by round so that drift on a shared machine hits all of them alike."""
    steps = [_steps(runner, context, rows) for rows in range(1, max_rows + 1)]
    for fn in steps:
        fn()
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for fn, out in zip(steps, times):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return [sorted(t)[len(t) // 2] * 1000 for t in times]


def profile_section(model_dir: str = str(ROOT / DEFAULT_MODEL), k: int = 5,
                    context: int = CONTEXT) -> list[str]:
    """Markdown lines: forward time by backend (best of 5 rounds of 30), and the top operators
    of the default backend's verification forward."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kernels.linear import available

    lines = ["## Verifier forward profile (in process)", "",
             f"The target's paged forward after {context} cached tokens, one torch thread: one "
             f"decode row and one verification of k + 1 = {k + 1} rows, by matmul backend "
             "(`--linear`, kernels/linear.py; best of 5 rounds of 30 calls).", "",
             "| backend | 1 row ms | k + 1 rows ms | k + 1 rows / 1 row |", "|---|---:|---:|---:|"]
    default = _runner(model_dir, "auto")
    for backend in ("dense", "onednn", "fp16", "fp16-dot"):
        if not available(backend):
            continue
        try:
            runner = default if backend == default.linear else _runner(model_dir, backend)
        except ValueError:  # fp16 on weights that are not exactly fp16 values
            continue
        one = _best_ms(_steps(runner, context, 1))
        many = _best_ms(_steps(runner, context, k + 1))
        name = f"{backend} (auto's choice)" if runner is default else backend
        lines.append(f"| {name} | {one:.2f} | {many:.2f} | {many / one:.2f}x |")
    if default is not None:  # the verifier's default: --linear auto
        sweep = rows_sweep(default, context)
        lines += ["", f"Forward ms by rows with `--linear auto` ({default.linear}), median of 15 "
                      "rounds, rows interleaved:", "",
                  "| rows | " + " | ".join(str(r) for r in range(1, len(sweep) + 1)) + " |",
                  "|---|" + "---:|" * len(sweep),
                  "| ms | " + " | ".join(f"{t:.1f}" for t in sweep) + " |",
                  "| / 1 row | " + " | ".join(f"{t / sweep[0]:.2f}" for t in sweep) + " |"]
        step = _steps(default, context, k + 1)
        for _ in range(5):
            step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(50):
                step()
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events) or 1.0
        lines += ["", f"Top operators of the k + 1-row forward with `--linear auto` "
                      f"({default.linear}), torch profiler, 50 calls:", "",
                  "| operator | self CPU share | calls per forward |", "|---|---:|---:|"]
        for e in events[:8]:
            lines.append(f"| `{e.key}` | {e.self_cpu_time_total / total:.0%} | "
                         f"{e.count / 50:.0f} |")
    del torch
    return lines + [""]


if __name__ == "__main__":
    print("\n".join(profile_section()))
