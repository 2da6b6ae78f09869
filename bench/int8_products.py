"""torch's int8 weight-only product (torch._weight_int8pack_mm) against the project's int8-dot and
fp16-dot on one of the real target's weights (the fused gate|up, 3072 x 576): whether each
gives a row the same bits alone and among 2-13 rows, and its best time for 1, 4 and 10 rows at 1
and 2 threads (best of the repeats: on a shared machine the nearest to idle).

    python bench/int8_products.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from kernels import fp16_dot, int8_dot  # noqa: E402

OUT, IN = 3072, 576
REPEATS = 40


def products(w: torch.Tensor) -> dict:
    q, scale = int8_dot.quantize(w)
    packed8, packed16 = int8_dot.pack(q), fp16_dot.pack(w.half().float())
    return {
        "torch int8pack_mm, fp32 rows": lambda x: torch._weight_int8pack_mm(x, q, scale),
        "torch int8pack_mm, bf16 rows": lambda x: torch._weight_int8pack_mm(
            x.bfloat16(), q, scale.bfloat16()),
        "int8-dot": lambda x: int8_dot.product(x, packed8, scale),
        "fp16-dot": lambda x: fp16_dot.product(x, packed16, OUT),
    }


def invariant(fn, x: torch.Tensor) -> bool:
    alone = torch.cat([fn(x[i:i + 1]) for i in range(x.shape[0])])
    return all(torch.equal(fn(x[:rows]), alone[:rows]) for rows in range(2, 14))


def best_ms(fn, x: torch.Tensor) -> float:
    fn(x)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(OUT, IN, generator=g) * 0.02
    x = torch.randn(16, IN, generator=g)
    print(f"load average at start: {', '.join(f'{v:.2f}' for v in os.getloadavg())}\n")
    print("| product | invariant 1 thr / 2 thr | 1 row, 1 thr | 1 row, 2 thr | 4 rows, 2 thr "
          "| 10 rows, 2 thr |")
    print("|---|---|---:|---:|---:|---:|")
    for name, fn in products(w).items():
        cells, verdicts = {}, []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            verdicts.append("yes" if invariant(fn, x) else "no")
            for rows in (1, 4, 10):
                cells[(threads, rows)] = best_ms(fn, x[:rows])
        print(f"| {name} | {' / '.join(verdicts)} | {cells[(1, 1)]:.3f} | {cells[(2, 1)]:.3f} | "
              f"{cells[(2, 4)]:.3f} | {cells[(2, 10)]:.3f} |")
    print(f"\nload average at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
