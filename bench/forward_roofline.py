"""The target's forward held against this machine's limits (`make bench-forward`,
bench/reports/forward.md).

A CPU forward of a few rows reads every weight once and does 2 FLOPs per weight per row, so its
floor is max(weight bytes / read bandwidth, rows x FLOPs per row / FLOP rate), both measured
here, per thread count: the read bandwidth as torch.sum over a float32 buffer the size of a
backend's weights (read again and again, as the forward reads them), the FLOP rate as MKL's
sgemm of 1024 x 1024 matrices (in cache); each the best of the rounds, since another process
on the machine can only slow a probe down (a ceiling, not a typical value). Then the target's
paged forward (verifier_service.model.runner, the lean path) after 100 cached tokens for 1 to
13 rows at 1 and 2 threads per matmul backend (kernels/linear.py), and its products alone
(every packed product of a forward called in turn on rows of the right width: what the
forward's other work, attention, norms and Python, adds is the difference), and auto's forward
with the CPU step kernels (kernels/cpu_step.py) turned off, the torch operators in their place.
Every cell is
interleaved with every other round by round (backends, thread counts, row counts, the
bandwidth and FLOP probes), so drift on a shared machine hits all of them alike; medians, with
the spread.

    python bench/forward_roofline.py                  # the real model, the report
    python bench/forward_roofline.py --rounds 3 --max-rows 4 --out /tmp/forward.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import markdown_table, write_markdown  # noqa: E402

REAL_MODEL = "models/smollm2-135m-instruct"
CONTEXT = 100  # cached tokens before the timed rows
THREADS = (1, 2)
BACKENDS = ("dense", "onednn", "fp16", "fp16-dot")
REPORTED = (*BACKENDS, "int8-dot")  # --backends may also name --quantization int8's product
PRODUCT_ROWS = (1, 4, 10)  # row counts whose products are also timed alone
QUIET = 0.25  # cores other processes may use in a round that counts (of the machine's)
MIN_QUIET = 5  # fewer quiet rounds than this: every round counts
GOALS = ((1, 1.25, "1 row / fp16 weight-read time"), (4, 1.15, "4 rows / 1 row"),
         (10, 1.6, "10 rows / 1 row"))


# ---- the roofline's arithmetic (tests/bench/test_forward_roofline.py) ----

def bytes_per_weight(backend: str) -> int:
    """What one weight of a product reads: int8 kernels 1 byte (and a float32 scale per column,
    left out: 0.3%), fp16 kernels 2 bytes, the fp32 ones 4."""
    return 1 if backend.startswith("int8") else 2 if backend.startswith("fp16") else 4


def weight_bytes(shapes: list[tuple[int, int]], backend: str) -> int:
    """Bytes a forward reads for the products' weights [out, in] on `backend` (the embedding
    rows, norms and KV cache it also reads are left out: ~5 MB at CONTEXT, <2%)."""
    return sum(o * i for o, i in shapes) * bytes_per_weight(backend)


def flops_per_row(shapes: list[tuple[int, int]]) -> int:
    """A multiply and an add per weight per row (attention's own FLOPs left out: <1% here)."""
    return 2 * sum(o * i for o, i in shapes)


def roofline_ms(nbytes: float, flops: float, rows: int, bandwidth: float, flop_rate: float
                ) -> float:
    """The floor of a forward of `rows` rows in ms: reading `nbytes` at `bandwidth` bytes/s or
    doing rows x `flops` at `flop_rate` FLOP/s, whichever takes longer."""
    return 1000 * max(nbytes / bandwidth, rows * flops / flop_rate)


@dataclass
class Samples:
    """Seconds of one cell, one per round."""
    times: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    def spread(self, scale: float = 1000) -> str:
        """The middle 80% of the rounds (min-max under 10 rounds), scaled (ms by default)."""
        t = sorted(self.times)
        cut = len(t) // 10
        return f"{t[cut] * scale:.1f}-{t[len(t) - 1 - cut] * scale:.1f}"


# ---- measurements ----

def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _shapes(runner) -> list[tuple[int, int]]:
    """[out, in] of every product of the lean forward: the head and each layer's four."""
    lean = runner._lean
    products = [lean.head] + [p for layer in lean.layers for p in (layer[1], layer[2], layer[4],
                                                                  layer[5])]
    return [tuple(p.weight.shape) for p in products]


def _products(runner, rows: int):
    """A function calling every product of a forward once on rows of its input width."""
    import torch

    lean = runner._lean
    products = [p for layer in lean.layers for p in (layer[1], layer[2], layer[4], layer[5])]
    products.append(lean.head)
    g = torch.Generator().manual_seed(rows)
    inputs = {w: torch.randn(rows, w, generator=g) for w in {p.weight.shape[1] for p in products}}
    calls = [(p, inputs[p.weight.shape[1]]) for p in products]

    def run():
        with torch.inference_mode():
            for p, x in calls:
                p(x)
    return run


def measure(model_dir: str, backends: tuple[str, ...], threads: tuple[int, ...],
            max_rows: int, rounds: int, log=print) -> dict:
    """Every cell's Samples, interleaved round by round; keys: ("read", nbytes, t),
    ("flops", t), ("forward", backend, t, rows), ("products", backend, t, rows)."""
    import torch
    from forward_profile import _runner, _steps

    from kernels.linear import available

    auto = _runner(model_dir, "auto")
    runners = {}
    for backend in backends:
        if backend == auto.linear:
            runners[backend] = auto
            continue
        if not available(backend):
            log(f"{backend}: not available here, left out")
            continue
        try:
            runners[backend] = _runner(model_dir, backend)
        except ValueError as exc:  # fp16 kernels on weights that are not exactly fp16 values
            log(f"{backend}: {exc}, left out")
    shapes = _shapes(next(iter(runners.values())))
    sizes = sorted({weight_bytes(shapes, b) for b in runners})
    buffers = {n: torch.ones(n // 4) for n in sizes}
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    steps = {(be, r): _steps(run, CONTEXT, r) for be, run in runners.items()
             for r in range(1, max_rows + 1)}
    products = {(be, r): _products(run, r) for be, run in runners.items()
                for r in PRODUCT_ROWS if r <= max_rows}
    from kernels import cpu_step

    kernels_on = cpu_step.available
    ops = {r: _steps(auto, CONTEXT, r) for r in PRODUCT_ROWS if r <= max_rows}
    cells: dict = {}

    def add(key, seconds):
        cells.setdefault(key, Samples([])).times.append(seconds)

    others: list[float] = []  # cores the machine's other processes used, per round
    for i in range(rounds + 1):  # round 0 warms every cell up, untimed
        busy, own, wall = _busy_seconds(), _own_seconds(), time.perf_counter()
        for t in threads:
            torch.set_num_threads(t)
            for n, buf in buffers.items():
                buf.sum()
                add(("read", n, t), _timed(buf.sum))
            torch.mm(a, b)
            add(("flops", t), _timed(lambda: torch.mm(a, b)))
            for be in runners:
                steps[(be, 1)]()  # a thread-count switch's first call is not a step's cost
                for r in range(1, max_rows + 1):
                    add(("forward", be, t, r), _timed(steps[(be, r)]))
                for r in PRODUCT_ROWS:
                    if (be, r) in products:
                        add(("products", be, t, r), _timed(products[(be, r)]))
            cpu_step.available = lambda x: False  # the torch operators around the products
            try:
                ops[1]()
                for r, step in ops.items():
                    add(("ops", auto.linear, t, r), _timed(step))
            finally:
                cpu_step.available = kernels_on
        if busy is not None:
            others.append(max(0.0, (_busy_seconds() - busy - (_own_seconds() - own))
                              / (time.perf_counter() - wall)))
        if i == 0:
            cells.clear()
            others.clear()
        log(f"round {i}/{rounds}" + (f": other processes {others[-1]:.2f} cores"
                                     if others else ""))
    cells["others"] = others
    cells["split"] = {r: op_split(auto, r) for r in PRODUCT_ROWS if r <= max_rows}
    cells["shapes"] = shapes
    cells["chosen"] = auto.linear
    # whether a row gets the same bits from each backend as from auto's (the first layer's
    # down projection, the longest reduction): a choice by row count could only switch
    # between kernels that agree
    x = torch.randn(1, auto._lean.layers[0][5].weight.shape[1], generator=torch.Generator()
                    .manual_seed(0))
    with torch.inference_mode():
        want = auto._lean.layers[0][5](x)
        cells["same_bits"] = {be: bool(torch.equal(run._lean.layers[0][5](x), want))
                              for be, run in runners.items()}
    return cells


def op_split(runner, rows: int, repeats: int = 30) -> dict[str, float]:
    """Mean ms per forward of `rows` rows (at the last thread count set) in each kind of work:
    the products, attention (RoPE, the cache write and attention), the norms and SiLU, and the
    rest (embedding, the plan's tensors, Python), each call timed by a wrapper (which adds its
    own few microseconds a call to the rest)."""
    import torch
    from forward_profile import _steps

    from kernels import cpu_step
    from kernels.linear import PackedLinear
    from verifier_service.kv.cpu_attention import CpuAttention

    spent = {"products": 0.0, "attention": 0.0, "norms and SiLU": 0.0}
    patched = [(PackedLinear, "__call__", "products"), (CpuAttention, "__call__", "attention"),
               (cpu_step, "add_rms", "norms and SiLU"), (cpu_step, "silu_mul", "norms and SiLU")]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]

    def timed(real, kind):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                spent[kind] += time.perf_counter() - start
        return call

    step = _steps(runner, CONTEXT, rows)
    step()
    try:
        for owner, name, kind in patched:
            setattr(owner, name, timed(getattr(owner, name), kind))
        for key in spent:
            spent[key] = 0.0
        with torch.inference_mode():
            start = time.perf_counter()
            for _ in range(repeats):
                step()
            total = time.perf_counter() - start
    finally:
        for owner, name, real in saved:
            setattr(owner, name, real)
    out = {k: 1000 * v / repeats for k, v in spent.items()}
    out["rest"] = 1000 * total / repeats - sum(out.values())
    out["forward"] = 1000 * total / repeats
    return out


# ---- the report ----

def quiet_rounds(cells: dict) -> tuple[dict, str]:
    """The cells restricted to the rounds in which the machine's other processes used at most
    QUIET cores (when at least MIN_QUIET rounds were), and a sentence saying which were kept."""
    others = cells.get("others") or []
    quiet = [i for i, o in enumerate(others) if o <= QUIET]
    if not others:
        return cells, "Every round counts (the machine's other work is not known here)."
    said = (f"Other processes used {statistics.median(others):.2f} cores in the median round "
            f"({min(others):.2f}-{max(others):.2f}); ")
    if len(quiet) < MIN_QUIET or len(quiet) == len(others):
        return cells, said + f"every one of the {len(others)} rounds counts."
    kept = {k: (Samples([v.times[i] for i in quiet]) if isinstance(v, Samples) else v)
            for k, v in cells.items()}
    return kept, said + (f"the {len(quiet)} of {len(others)} rounds in which they used at most "
                         f"{QUIET} cores count, the others are left out.")


def report(cells: dict, facts: dict, load_end: str, max_rows: int) -> list[str]:
    cells, rounds_kept = quiet_rounds(cells)
    shapes = cells["shapes"]
    backends = [b for b in REPORTED if ("forward", b, THREADS[0], 1) in cells]
    threads = sorted({k[2] for k in cells if isinstance(k, tuple) and k[0] == "forward"})
    sizes = sorted({k[1] for k in cells if isinstance(k, tuple) and k[0] == "read"})
    bw = {(n, t): n / min(cells[("read", n, t)].times) for n in sizes for t in threads}
    rate = {t: 2 * 1024 ** 3 / min(cells[("flops", t)].times) for t in threads}
    lines = ["# The target's forward against this machine's limits", "",
             "`make bench-forward` (bench/forward_roofline.py). " + __doc__.split("\n\n")[1]
             .replace("\n", " "), ""]
    lines += ["| machine | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in facts.items()]
    lines += [f"| load average (1/5/15 min) at the end | {load_end} |", "", rounds_kept, ""]
    lines += ["## Limits measured here", ""]
    cols = {"threads": "r"}
    cols.update({f"read GB/s, {n / 1e6:.0f} MB": "r" for n in sizes})
    cols.update({"sgemm GFLOP/s": "r"})
    def per_second(amount: float, samples: Samples) -> str:  # best (median, worst), in G/s
        lo, hi = amount / max(samples.times) / 1e9, amount / min(samples.times) / 1e9
        return f"{hi:.1f} ({amount / samples.median / 1e9:.1f}, {lo:.1f})"

    rows = [[t] + [per_second(n, cells[("read", n, t)]) for n in sizes]
            + [per_second(2 * 1024 ** 3, cells[("flops", t)])] for t in threads]
    lines += markdown_table(cols, rows) + [
        "", "The best of the rounds, the limit used below (the median and the worst in "
            "brackets: how much the machine's other work took).", ""]
    flops = flops_per_row(shapes)
    lines += ["## Weights per backend", "",
              f"{len(shapes)} products ([out, in]: the head {shapes[0]}, per layer "
              f"{', '.join(str(s) for s in shapes[1:5])}); {flops / 1e6:.0f} MFLOP per row.", ""]
    rows = []
    for be in backends:
        n = weight_bytes(shapes, be)
        rows.append([be, f"{n / 1e6:.0f}"] + [f"{1000 * n / bw[(n, t)]:.1f}" for t in threads]
                    + [f"{1000 * flops / rate[t]:.2f}" for t in threads])
    lines += markdown_table({"backend": "l", "weight MB": "r",
                             **{f"read ms, {t} thr": "r" for t in threads},
                             **{f"FLOP ms per row, {t} thr": "r" for t in threads}}, rows) + [""]
    lines += ["## Forward by rows", "",
              f"Median ms of the target's forward after {CONTEXT} cached tokens; `/ floor` is the "
              "forward over the roofline max(bytes / bandwidth, FLOPs / rate) at that thread "
              "count; `products` the forward's products alone.", ""]
    head = {"backend": "l", "threads": "r", "": "l"}
    head.update({str(r): "r" for r in range(1, max_rows + 1)})
    rows = []
    for be in backends:
        n = weight_bytes(shapes, be)
        for t in threads:
            ms = [cells[("forward", be, t, r)].median * 1000 for r in range(1, max_rows + 1)]
            floor = [roofline_ms(n, flops, r, bw[(n, t)], rate[t]) for r in range(1, max_rows + 1)]
            rows.append([be, t, "ms"] + [f"{m:.1f}" for m in ms])
            rows.append(["", "", "/ 1 row"] + [f"{m / ms[0]:.2f}" for m in ms])
            rows.append(["", "", "/ floor"] + [f"{m / f:.2f}" for m, f in zip(ms, floor)])
            rows.append(["", "", "products"] + [
                f"{cells[('products', be, t, r)].median * 1000:.1f}"
                if ("products", be, t, r) in cells else "" for r in range(1, max_rows + 1)])
    lines += markdown_table(head, rows) + [""]
    lines += ["Spread (ms, middle 80% of the rounds) of the forward at 1, 4 and 10 rows:", ""]
    rows = [[be, t] + [cells[("forward", be, t, r)].spread() if r <= max_rows else ""
                       for r in PRODUCT_ROWS] for be in backends for t in threads]
    lines += markdown_table({"backend": "l", "threads": "r",
                             **{f"{r} rows": "r" for r in PRODUCT_ROWS}}, rows) + [""]
    same = cells.get("same_bits", {})
    lines += [f"Does a row get the bits of `{cells['chosen']}` (auto's choice) from the other "
              "backends (the first layer's down projection)? "
              + ", ".join(f"{be}: {'yes' if ok else 'no'}" for be, ok in same.items()
                          if be != cells["chosen"]) + ".", ""]
    lines += goals(cells, bw, threads, max_rows)
    return lines


def goals(cells: dict, bw: dict, threads: list[int], max_rows: int) -> list[str]:
    """The issue's goals for auto's choice at the default thread count: met or MISSED."""
    chosen, t = cells.get("chosen"), max(threads)
    if chosen is None or ("forward", chosen, t, 1) not in cells:
        return []
    shapes = cells["shapes"]
    read16 = weight_bytes(shapes, "fp16")
    one = cells[("forward", chosen, t, 1)].median
    out = [f"## Goals (`--linear auto` = {chosen}, {t} threads)", "",
           "| goal | measured | limit | |", "|---|---:|---:|---|"]
    for rows, limit, what in GOALS:
        if rows > max_rows:
            continue
        if rows == 1:
            value = one / (read16 / bw[(read16, t)])
        else:
            value = cells[("forward", chosen, t, rows)].median / one
        out.append(f"| {what} | {value:.3f}x | {limit:.2f}x | "
                   f"{'met' if value <= limit else 'MISSED'} |")
    return (out + [""] + where_the_time_goes(cells, chosen, t, read16 / bw[(read16, t)] * 1000)
            + step_kernels(cells, chosen, t))


def step_kernels(cells: dict, backend: str, t: int) -> list[str]:
    """The forward with the CPU step kernels against the torch operators, and its split."""
    rows = []
    for r in PRODUCT_ROWS:
        on, off = cells.get(("forward", backend, t, r)), cells.get(("ops", backend, t, r))
        if on is not None and off is not None:
            rows.append([r, f"{off.median * 1000:.1f}", f"{on.median * 1000:.1f}",
                         f"{off.median / on.median:.2f}x"])
    if not rows:
        return []
    out = [f"### The step kernels ({backend}, {t} threads)", "",
           "The forward with the layer's work around the products as torch operators (norms, "
           "RoPE, views, SDPA or attention over runs, the cache write) and with "
           "kernels/cpu_step.py's calls, median ms:", ""]
    out += markdown_table({"rows": "r", "torch operators": "r", "step kernels": "r",
                           "speed-up": "r"}, rows) + [""]
    split = cells.get("split") or {}
    if split:
        kinds = ["products", "attention", "norms and SiLU", "rest", "forward"]
        out += ["Where a forward's time goes with the step kernels (mean ms, each call timed "
                "by a wrapper, after the rounds):", ""]
        out += markdown_table({"rows": "r", **{k: "r" for k in kinds}},
                              [[r] + [f"{split[r][k]:.2f}" for k in kinds] for r in split])
        out += [""]
    return out


def where_the_time_goes(cells: dict, backend: str, t: int, read_ms: float) -> list[str]:
    """The forward split into its products and the rest (attention, norms, RoPE, Python), at
    1 row and as rows are added: which of the two a missed goal is owed to."""
    def ms(kind, rows):
        key = (kind, backend, t, rows)
        return cells[key].median * 1000 if key in cells else None

    f1, p1 = ms("forward", 1), ms("products", 1)
    if f1 is None or p1 is None:
        return []
    out = [f"Where the time goes ({backend}, {t} threads): at 1 row the products take "
           f"{p1:.1f} ms ({p1 / read_ms:.2f}x the fp16 weight-read time) and the rest of the "
           f"forward {f1 - p1:.1f} ms."]
    for rows in PRODUCT_ROWS[1:]:
        f, p = ms("forward", rows), ms("products", rows)
        if f is not None and p is not None:
            out.append(f"From 1 to {rows} rows the forward grows {f - f1:.1f} ms: the products "
                       f"{p - p1:.1f} ms ({p / p1:.2f}x), the rest {(f - p) - (f1 - p1):.1f} ms.")
    return [" ".join(out), ""]


def _busy_seconds() -> float | None:
    """CPU seconds every process of the machine has run (/proc/stat), None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


def main(argv=None) -> None:
    from compare_bench import machine_facts

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / REAL_MODEL))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--max-rows", type=int, default=13)
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--out", default=str(ROOT / "bench/reports/forward.md"))
    args = p.parse_args(argv)
    facts = machine_facts(0, 0)
    facts.pop("torch threads (HF in the bench process; verifier; each proposer)", None)
    facts["torch threads"] = ", ".join(str(t) for t in THREADS) + " (each cell)"
    facts["model"] = Path(args.model).name
    import torch

    from kernels import fp16_dot
    facts["vector ISA (torch; fp16-dot)"] = (f"{torch.backends.cpu.get_cpu_capability()}; "
                                             f"{fp16_dot.isa() or 'not built'}")
    busy, own, wall = _busy_seconds(), _own_seconds(), time.perf_counter()
    cells = measure(args.model, tuple(args.backends.split(",")), THREADS, args.max_rows,
                    args.rounds, log=lambda s: print(s, file=sys.stderr, flush=True))
    load_end = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    if busy is not None:  # what the machine's other processes ran meanwhile, in cores
        others = (_busy_seconds() - busy - (_own_seconds() - own)) / (time.perf_counter() - wall)
        load_end += (f"; other processes used {max(others, 0):.2f} of the {os.cpu_count()} "
                     "cores on average during the run")
    write_markdown(args.out, report(cells, facts, load_end, args.max_rows))


if __name__ == "__main__":
    main()
