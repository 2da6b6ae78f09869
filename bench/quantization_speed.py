"""What `--quantization int8` buys in speed: the target's paged forward (the verifier's lean
path, bench/forward_profile.py's step after cached tokens) and its products alone, fp16-dot
against int8-dot, at 1, 4 and 10 rows and 1 and 2 threads, the cells interleaved round by round.
Each cell's best round and its median: on a shared machine another process can only slow a
round down, so the best is the nearer to an idle machine's figure (the load is printed).

    python bench/quantization_speed.py --rounds 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

REAL_MODEL = "models/smollm2-135m-instruct"
BACKENDS = ("fp16-dot", "int8-dot")
ROWS = (1, 4, 10)
THREADS = (1, 2)
CONTEXT = 100


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(model_dir: str, rounds: int) -> dict:
    import torch
    from forward_profile import _runner, _steps
    from forward_roofline import _products

    runners = {be: _runner(model_dir, be) for be in BACKENDS}
    cells = {}
    fns = {(kind, be, r): (_steps(run, CONTEXT, r) if kind == "forward" else _products(run, r))
           for be, run in runners.items() for r in ROWS for kind in ("forward", "products")}
    for i in range(rounds + 1):  # round 0 warms up, untimed
        for t in THREADS:
            torch.set_num_threads(t)
            for (kind, be, r), fn in fns.items():
                fn()  # a thread-count switch's first call is not the cell's cost
                seconds = _timed(fn)
                if i:
                    cells.setdefault((kind, be, t, r), []).append(seconds)
        print(f"round {i}/{rounds}, load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    return cells


def report(cells: dict) -> list[str]:
    rows = ["| what | threads | rows | fp16-dot ms | int8-dot ms | int8 / fp16 |",
            "|---|---:|---:|---:|---:|---:|"]
    for kind in ("forward", "products"):
        for t in THREADS:
            for r in ROWS:
                a, b = cells[(kind, "fp16-dot", t, r)], cells[(kind, "int8-dot", t, r)]
                rows.append(f"| {kind} | {t} | {r} | {min(a) * 1e3:.1f} "
                            f"({statistics.median(a) * 1e3:.1f}) | {min(b) * 1e3:.1f} "
                            f"({statistics.median(b) * 1e3:.1f}) | {min(b) / min(a):.2f} |")
    return ["Best round in ms (the median in brackets); the ratio of the bests.", "", *rows]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / REAL_MODEL))
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    start = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    cells = measure(args.model, args.rounds)
    end = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print("\n".join([f"Load average at start {start}, at the end {end}.", "", *report(cells)]))


if __name__ == "__main__":
    main()
