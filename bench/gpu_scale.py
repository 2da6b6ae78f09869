"""The step at deployment scale (`make bench-gpu-scale`, bench/reports/gpu-scale.md): real model
shapes with dummy weights (--load-format dummy, models/shapes/), bf16, graphs on, one run.

    python3 bench/gpu_scale.py                  # on a CUDA machine (one H100/H200: ~6 min)
    python3 bench/gpu_scale.py --dry            # the same code end to end on the CPU, tiny shape

Per target shape (Llama-3.1-8B with an EAGLE-3 head of its shape and a Llama-3.2-1B draft pod,
Llama-3.2-1B, Qwen2.5-7B), the verifier built as it serves (`--gpu-memory-utilization 0.9`,
its step executor and captured graphs, warmed up):
  * the device's copy bandwidth, measured in this run (a device-to-device copy: bytes read +
    written / time);
  * the off decode step at batch 1, 8, 32, 64 and context 512 and 4,096: wall ms (plan, copy
    in, replay, copy out, the one wait), the device's time of its work (CUDA events around the
    launch), their difference (the host gap), and the memory-bandwidth limit: the bytes a
    step must read (the weights it multiplies by: every layer, the final norm and the output
    head; plus every sequence's cached keys and values) / the copy bandwidth;
  * verification of 2, 4, 8, 16 rows per sequence at batch 1 and 8 against the off step;
  * launches per step (torch profiler: kernel launches, graph launches and copies of one step);
  * the EAGLE head per drafted token (greedy chains of 4, a 16-node tree of 4 branches) and the
    draft pod (a proposer process drafting with the 1B shape over gRPC on loopback): its round
    trip per step and per drafted token, and the wait a step saw for it with drafting ahead off
    and on, through the engine;
  * Hugging Face transformers on the same dummy weights (same seed) and shape, batch 1,
    context 512: its eager forward with a static cache, and torch.compile of it
    (mode reduce-overhead) for the first shape;
  * projected speed-up per method: tokens per step measured on the real model
    (bench/reports/bench-real.md) x the off step / (the verification step + the drafting),
    labelled as projected.

--dry runs every part on the CPU with models/shapes/tiny-llama (head and draft of its shape):
it checks the harness, not the speed; CUDA-only figures (device time, launches, graphs,
torch.compile) say n/a there.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from bench_common import write_markdown  # noqa: E402

SHAPES = ROOT / "models" / "shapes"


@dataclass(frozen=True)
class Plan:
    shapes: tuple  # (target, EAGLE head or None, draft model or None)
    batches: tuple
    contexts: tuple
    rows: tuple
    verify_batches: tuple
    steps: int
    copy_mb: int
    hf_compile: bool
    requests_tokens: int


REAL = Plan(shapes=(("llama-3.1-8b", "llama-3.1-8b-eagle3", "llama-3.2-1b"),
                    ("llama-3.2-1b", None, None), ("qwen2.5-7b", None, None)),
            batches=(1, 8, 32, 64), contexts=(512, 4096), rows=(2, 4, 8, 16),
            verify_batches=(1, 8), steps=20, copy_mb=2048, hf_compile=True, requests_tokens=64)
DRY = Plan(shapes=(("tiny-llama", "tiny-llama-eagle3", "tiny-llama"),), batches=(1, 2),
           contexts=(32, 64), rows=(2, 4), verify_batches=(1, 2), steps=3, copy_mb=16,
           hf_compile=False, requests_tokens=16)
EAGLE_RUNS = (("chain k=4", 4, 1), ("tree 16 nodes b=4", 16, 4))
DRAFT_K = 4


# -- timing -------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, mb: int) -> float:
    """Bytes per second a device-to-device copy moves (read + written), best of 5."""
    n = mb << 20
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    best = float("inf")
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        for _ in range(5):
            dst.copy_(src)
        sync(device)
        best = min(best, (time.perf_counter() - start) / 5)
    del src, dst
    return 2 * n / best


@dataclass
class StepTime:
    wall_ms: float
    device_ms: float | None  # CUDA events around the launch; None on the CPU

    @property
    def gap_ms(self) -> float | None:
        return None if self.device_ms is None else self.wall_ms - self.device_ms


def time_step(engine, batch: int, context: int, rows: int, steps: int) -> StepTime:
    """Median of `steps` verifier steps of `batch` sequences feeding `rows` rows each (1: the
    off decode step; r > 1: a chain of r - 1 drafts verified) after `context` cached tokens,
    through the engine's executor (its plan, copy in, graph replay, copy out and one wait).
    The cache blocks are reserved and zeroed, not prefilled: a step reads the same bytes."""
    from kernels.layout import StepLayout
    from verifier_service.kv.cache import BlockTable

    runner, ex = engine.runner, engine.executor
    device = runner.device
    tables = [BlockTable() for _ in range(batch)]
    try:
        for t in tables:
            runner.kv.reserve(t, context + rows)
        layout = StepLayout.build([rows] * batch, [context] * batch, [rows - 1] * batch,
                                  [True] * batch)
        g = torch.Generator().manual_seed(batch * 7919 + rows)
        ids = torch.randint(3, runner.vocab_size, (batch * rows,), generator=g).tolist()
        blocks = [t.blocks for t in tables]
        walls, devs = [], []
        for i in range(steps + 3):
            start = time.perf_counter()
            plan = ex.plan(layout, ids, blocks)
            if device.type == "cuda":
                before, after = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                before.record()
            out = ex.execute(plan)
            if device.type == "cuda":
                after.record()
            ex.fetch([out.argmax, out.num_accepted])
            wall = time.perf_counter() - start
            if i >= 3:
                walls.append(wall * 1000)
                if device.type == "cuda":
                    devs.append(before.elapsed_time(after))
        return StepTime(_median(walls), _median(devs) if devs else None)
    finally:
        for t in tables:
            runner.kv.truncate(t, 0)


def launches_per_step(engine, rows: int, context: int) -> dict[str, int] | None:
    """Kernel launches, graph launches and copies of one step (torch profiler), CUDA only."""
    if engine.runner.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    counts: dict[str, int] = {}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        time_step(engine, 1, context, rows, 1)
    kinds = {"cudaLaunchKernel": "kernels", "cudaLaunchKernelExC": "kernels",
             "cuLaunchKernel": "kernels", "cudaGraphLaunch": "graphs",
             "cudaMemcpyAsync": "copies", "cudaStreamSynchronize": "syncs",
             "cudaEventSynchronize": "syncs"}
    for e in prof.key_averages():
        if e.key in kinds:
            counts[kinds[e.key]] = counts.get(kinds[e.key], 0) + e.count
    # time_step ran 4 steps (3 warm-up); the profile holds all of them
    return {k: round(v / 4) for k, v in counts.items()}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if s else float("nan")


# -- bytes a step must read -----------------------------------------------------------------

def step_bytes(cfg: dict, batch: int, context: int, itemsize: int, kv_per_token: int) -> int:
    """Weights a decode step multiplies by (every layer, the final norm, the output head: the
    input embedding is only indexed) plus the cached keys and values every sequence reads."""
    from splitspec.dummy_weights import parameter_count

    embed = cfg["vocab_size"] * cfg["hidden_size"]
    weights = parameter_count(cfg) - (0 if cfg.get("tie_word_embeddings") else embed)
    return weights * itemsize + batch * context * kv_per_token


# -- the Hugging Face baseline ---------------------------------------------------------------

def hf_decode_ms(shape: Path, device: torch.device, dtype: torch.dtype, context: int,
                 compiled: bool, steps: int) -> tuple[float | None, str]:
    """Median ms of a batch-1 decode forward of transformers' own model (same dummy weights,
    seed 0) over a static cache after `context` tokens: eager, or torch.compile'd."""
    from transformers import StaticCache

    from splitspec.dummy_weights import dummy_causal_lm

    model = dummy_causal_lm(shape, device, dtype, seed=0, attn_implementation="sdpa")
    try:
        cache = StaticCache(config=model.config, max_cache_len=context + 8)
        ids = torch.randint(3, model.config.vocab_size, (1, context + 1), device=device)
        with torch.inference_mode():
            model(input_ids=ids[:, :context], past_key_values=cache,
                  cache_position=torch.arange(context, device=device), use_cache=True)
            forward = model.forward
            note = "eager"
            if compiled:
                forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
                note = "torch.compile (reduce-overhead)"
            pos = torch.tensor([context], device=device)
            started = time.perf_counter()
            for _ in range(3):  # compiles on the first calls
                forward(input_ids=ids[:, context:], past_key_values=cache, cache_position=pos,
                        use_cache=True)
            sync(device)
            if compiled:
                note += f", compiled in {time.perf_counter() - started:.0f} s"
            walls = []
            for _ in range(steps):
                start = time.perf_counter()
                out = forward(input_ids=ids[:, context:], past_key_values=cache,
                              cache_position=pos, use_cache=True)
                out.logits[:, -1].argmax(-1).cpu()  # the token to the host, as a server does
                walls.append((time.perf_counter() - start) * 1000)
        return _median(walls), note
    except Exception as exc:  # noqa: BLE001 - a baseline that does not run is reported, not fatal
        return None, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    finally:
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


# -- through the engine: EAGLE and the draft pod -------------------------------------------------

@dataclass
class Recorder:
    """An engine observer keeping decode steps' times and each method's drafting time."""

    steps: list = field(default_factory=list)

    def on_step(self, step) -> None:
        if not step.prefill_tokens:
            self.steps.append(step)

    def on_request_done(self, timeline) -> None:
        pass


async def run_method(engine, recorder: Recorder, method: str, k: int, branches: int,
                     tokens: int) -> dict[str, float]:
    """One greedy request with `method` (k tokens or tree nodes): its steps' mean drafting
    time (the method's round trip), the wait a step saw for drafts, and the step time."""
    from splitspec.params import (
        GenerationInput,
        SamplingParams,
        SpeculationPlan,
        StoppingCriteria,
    )

    prompt = tuple(5 + (i * 37) % 300 for i in range(48))
    inp = GenerationInput(f"scale-{uuid.uuid4().hex}", prompt, SamplingParams(temperature=0.0),
                          StoppingCriteria(max_tokens=tokens, ignore_eos=True),
                          SpeculationPlan(method, k, num_branches=branches))
    recorder.steps.clear()
    async for _ in engine.generate(inp):
        pass
    rts = [s.per_method[method].round_trip_s for s in recorder.steps
           if method in s.per_method and s.per_method[method].round_trip_s is not None]
    return {"steps": len(recorder.steps), "round_trip_ms": 1000 * _mean(rts),
            "wait_ms": 1000 * _mean([s.draft_seconds for s in recorder.steps]),
            "step_ms": 1000 * _mean([s.seconds for s in recorder.steps])}


async def run_concurrent(engine, n: int, tokens: int) -> dict[str, float]:
    """`n` greedy requests at once with speculation off (the running batch at its largest):
    aggregate tokens per second, and that every one finished (no out-of-memory)."""
    from splitspec.params import (
        GenerationInput,
        SamplingParams,
        SpeculationPlan,
        StoppingCriteria,
    )

    async def one(i: int) -> int:
        prompt = tuple(7 + (i * 131 + j * 17) % 500 for j in range(48))
        inp = GenerationInput(f"conc-{uuid.uuid4().hex}", prompt,
                              SamplingParams(temperature=0.0),
                              StoppingCriteria(max_tokens=tokens, ignore_eos=True),
                              SpeculationPlan())
        return sum([len(out.token_ids) async for out in engine.generate(inp)])

    start = time.perf_counter()
    done = await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - start
    return {"requests": n, "finished": sum(d == tokens for d in done),
            "tokens_per_s": sum(done) / wall}


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_draft_pod(draft: str, device: str, dtype: str, port: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    args = [sys.executable, "-m", "proposer_service.server", "--method", "draft", "--model",
            str(SHAPES / draft), "--load-format", "dummy", "--device", device, "--dtype", dtype,
            "--port", str(port), "--max-batch", "8", "--max-num-speculative-tokens", "16"]
    if device == "cpu":
        args += ["--threads", "1"]
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


async def connect(engine, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    for client in engine.proposers.values():
        while True:
            try:
                await client.connect()
                break
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(1.0)
    return True


# -- one shape -------------------------------------------------------------------------------

@dataclass
class ShapeResult:
    name: str
    params_b: float
    blocks: int = 0
    start_s: float = 0.0
    graphs: int = 0
    graph_pool_mb: float = 0.0
    off: dict = field(default_factory=dict)  # (batch, context) -> StepTime
    verify: dict = field(default_factory=dict)  # (batch, rows) -> StepTime
    limit_ms: dict = field(default_factory=dict)  # (batch, context) -> ms
    launches: dict = field(default_factory=dict)  # label -> counts
    hf: list = field(default_factory=list)  # (note, ms)
    eagle: list = field(default_factory=list)  # (label, k, measures)
    draft: list = field(default_factory=list)  # (label, measures)
    notes: list = field(default_factory=list)
    concurrent: dict = field(default_factory=dict)  # max_num_seqs requests at once


async def bench_shape(plan: Plan, target: str, head: str | None, draft: str | None,
                      device: torch.device, dtype: torch.dtype, bandwidth: float,
                      dry: bool) -> ShapeResult:
    import json

    from splitspec.dummy_weights import parameter_count
    from splitspec.params import SpeculationPlan  # noqa: F401 - imported for the engine's use
    from verifier_service.config import VerifierConfig
    from verifier_service.drafts.ahead_policy import AheadPolicy
    from verifier_service.server import build_engine
    from verifier_service.step.warmup import warm_up

    cfg = json.loads((SHAPES / target / "config.json").read_text())
    res = ShapeResult(target, parameter_count(cfg) / 1e9)
    dtype_name = str(dtype).removeprefix("torch.")
    pod, port = None, None
    if draft:
        port = free_port()
        pod = start_draft_pod(draft, device.type, dtype_name, port)
    for compiled in (False, True) if plan.hf_compile and target == plan.shapes[0][0] else (False,):
        ms, note = hf_decode_ms(SHAPES / target, device, dtype, 512 if not dry else 32,
                                compiled, plan.steps)
        res.hf.append((note, ms))
    max_len = max(plan.contexts) + 32
    config = VerifierConfig(
        model=str(SHAPES / target), load_format="dummy", device=device.type, dtype=dtype_name,
        max_num_seqs=max(plan.batches), max_num_speculative_tokens=16,  # a 16-node EAGLE tree
        max_model_len=max_len, max_num_batched_tokens=2048,
        gpu_memory_utilization=0.9 if device.type != "cpu" else 0.0,
        kv_cache_memory_mb=64 if device.type == "cpu" else 512, threads=1 if dry else 0,
        eagle=str(SHAPES / head) if head else "",
        proposer=(f"draft=127.0.0.1:{port}",) if draft else (), proposer_timeout_ms=2000.0,
        max_num_branches=4)
    started = time.perf_counter()
    recorder = Recorder()
    engine, *_ = build_engine(config, observers=[recorder])
    engine.start()
    try:
        await warm_up(engine)
        res.start_s = time.perf_counter() - started
        res.blocks = engine.runner.kv.num_blocks
        res.graphs = engine.executor.stats.graphs
        res.graph_pool_mb = engine.executor.stats.graph_pool_bytes / 2**20
        kv_token = engine.runner.kv.spec.bytes_per_token
        for context in plan.contexts:
            for batch in plan.batches:
                res.off[batch, context] = await engine.on_model_thread(
                    time_step, engine, batch, context, 1, plan.steps)
                res.limit_ms[batch, context] = 1000 * step_bytes(
                    cfg, batch, context, dtype.itemsize, kv_token) / bandwidth
        context = plan.contexts[0]
        for batch in plan.verify_batches:
            for rows in plan.rows:
                res.verify[batch, rows] = await engine.on_model_thread(
                    time_step, engine, batch, context, rows, plan.steps)
        for label, rows in (("off, batch 1", 1), (f"verify {plan.rows[-2]} rows", plan.rows[-2])):
            counts = await engine.on_model_thread(launches_per_step, engine, rows, context)
            if counts is not None:
                res.launches[label] = counts
        if target == plan.shapes[0][0]:
            res.concurrent = await run_concurrent(engine, max(plan.batches),
                                                  plan.requests_tokens // 2)
        if head:
            for label, k, branches in EAGLE_RUNS:
                res.eagle.append((label, k, await run_method(engine, recorder, "eagle", k,
                                                             branches, plan.requests_tokens)))
        if draft:
            if await connect(engine, 180.0):
                for mode in ("off", "on"):
                    engine.drafts.ahead_policy = AheadPolicy(mode)
                    await run_method(engine, recorder, "draft", DRAFT_K, 1, 8)  # settle
                    res.draft.append((f"ahead {mode}", await run_method(
                        engine, recorder, "draft", DRAFT_K, 1, plan.requests_tokens)))
            else:
                err = pod.stderr.read1(4000).decode(errors="replace") if pod.poll() else ""
                res.notes.append(f"the draft pod did not come up: {err.strip()[-300:]}")
    finally:
        await engine.shutdown()
        for client in engine.proposers.values():
            await client.close()
        if pod is not None:
            pod.terminate()
            try:
                pod.wait(30)
            except subprocess.TimeoutExpired:
                pod.kill()
        del engine
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return res


# -- projection ------------------------------------------------------------------------------

def real_tokens_per_step(path: Path) -> dict[str, float]:
    """configuration -> tokens per step, from the temperature-0 table of bench-real.md."""
    out: dict[str, float] = {}
    if not path.is_file():
        return out
    text = path.read_text()
    section = text.split("## Temperature 0", 1)[-1].split("\n## ", 1)[0]
    header = None
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "tokens / step" in cells:
            header = cells
            continue
        if header and len(cells) == len(header) and cells[0].startswith("splitspec "):
            try:
                out[cells[0].removeprefix("splitspec ")] = float(cells[header.index(
                    "tokens / step")])
            except ValueError:
                pass
    return out


def projection(res: ShapeResult, tps: dict[str, float], contexts: tuple) -> list[tuple]:
    """(method, tokens per step, rows verified, drafting ms, projected speed-up) at batch 1 and
    the first context, for every configuration of bench-real that names its k."""
    off = res.off.get((1, contexts[0]))
    if off is None:
        return []
    eagle_token = {k: m["round_trip_ms"] / k for _, k, m in res.eagle}
    draft_wait = {label: m["wait_ms"] for label, m in res.draft}
    rows_measured = sorted({r for (_, r) in res.verify})
    out = []
    for name, t in tps.items():
        m = re.match(r"(\w+) k=(\d+)(?: tree b=(\d+))?(?:, ahead (on|off))?", name)
        if not m:
            continue
        method, k = m.group(1), int(m.group(2))
        rows = next((r for r in rows_measured if r >= k + 1), None)
        if rows is None or (1, rows) not in res.verify:
            continue
        if method == "eagle":
            per = eagle_token.get(16 if m.group(3) else 4)
            drafting = None if per is None else per * k
        elif method == "draft":
            drafting = draft_wait.get(f"ahead {m.group(4) or 'off'}")
        elif method == "lookahead":
            drafting = 0.0
        else:
            drafting = None  # pods not measured here (n-gram, suffix, MLP)
        if drafting is None:
            continue
        verify = res.verify[1, rows].wall_ms
        out.append((name, t, rows, drafting, t * off.wall_ms / (verify + drafting)))
    return out


# -- report ----------------------------------------------------------------------------------

def fmt(x, spec=".2f") -> str:
    return "n/a" if x is None or x != x else format(x, spec)


def report(results: list[ShapeResult], plan: Plan, device: torch.device, bandwidth: float,
           dry: bool, tps: dict[str, float], wall_s: float) -> list[str]:
    name = (torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU")
    lines = ["# The step at deployment scale: real shapes, dummy weights", ""]
    if dry:
        lines += ["**CPU dry run** (`make bench-gpu-scale-dry`): the harness end to end on the "
                  "CPU with the tiny shape of models/shapes; no figure here says anything about "
                  "speed. Device time, host gap, launches, graphs and torch.compile are CUDA "
                  "figures and read n/a. The device run is `make bench-gpu-scale`.", "",
                  "Waiting for a device: every figure of the three real shapes (Llama-3.1-8B "
                  "with its EAGLE-3 head and Llama-3.2-1B draft pod, Llama-3.2-1B, Qwen2.5-7B): "
                  "the off step against the bandwidth limit at batch 1-64 and context 512 and "
                  "4,096, verification of 2-16 rows at batch 1 and 8, the host gap and launches "
                  "per step, the EAGLE head and draft pod per drafted token with drafting ahead "
                  "on and off, Hugging Face eager and compiled, the projected speed-ups, and "
                  "the KV blocks --gpu-memory-utilization 0.9 gives.", ""]
    lines += [f"Produced by `python bench/gpu_scale.py{' --dry' if dry else ''}` in "
              f"{wall_s:.0f} s on {name}, torch {torch.__version__}, "
              f"{'float32' if dry else 'bf16'}, weights `--load-format dummy` (seed 0: output "
              "meaningless, speed real), `--gpu-memory-utilization 0.9` on the device, graphs "
              f"on where the device has them. Copy bandwidth measured in this run: "
              f"**{bandwidth / 1e9:.0f} GB/s** (device-to-device copy, bytes read + written).",
              ""]
    for r in results:
        lines += [f"## {r.name} ({r.params_b:.2f} B parameters)", "",
                  f"Start-up with warm-up {r.start_s:.1f} s; KV cache {r.blocks} blocks; "
                  f"{r.graphs} step graphs, {r.graph_pool_mb:.0f} MiB pool.", ""]
        lines += ["### Off decode step against the memory-bandwidth limit", "",
                  "| batch | context | step ms (wall) | device ms | host gap ms | gap share | "
                  "limit ms | step / limit |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for (b, c), t in sorted(r.off.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            lim = r.limit_ms[b, c]
            share = None if t.gap_ms is None else t.gap_ms / t.wall_ms
            lines.append(f"| {b} | {c} | {t.wall_ms:.2f} | {fmt(t.device_ms)} | "
                         f"{fmt(t.gap_ms)} | {fmt(share, '.0%')} | {lim:.2f} | "
                         f"{t.wall_ms / lim:.2f}x |")
        if r.concurrent:
            c = r.concurrent
            lines += ["", f"{c['requests']} requests at once (speculation off, --max-num-seqs "
                          f"{c['requests']}, graphs where the device has them): "
                          f"{c['finished']} finished whole, "
                          f"{c['tokens_per_s']:.0f} tokens/s together."]
        lines += ["", f"### Verification of r rows per sequence (context {plan.contexts[0]})", "",
                  "| batch | rows | step ms | / off step |", "|---:|---:|---:|---:|"]
        for (b, rows), t in sorted(r.verify.items()):
            off = r.off[b, plan.contexts[0]]
            lines.append(f"| {b} | {rows} | {t.wall_ms:.2f} | {t.wall_ms / off.wall_ms:.2f}x |")
        lines += ["", "### Launches per step (torch profiler)", ""]
        if r.launches:
            lines += ["| step | " + " | ".join(sorted({k for c in r.launches.values()
                                                       for k in c})) + " |"]
            keys = sorted({k for c in r.launches.values() for k in c})
            lines += ["|---|" + "---:|" * len(keys)]
            for label, counts in r.launches.items():
                lines.append(f"| {label} | " + " | ".join(str(counts.get(k, 0)) for k in keys)
                             + " |")
        else:
            lines.append("n/a (CUDA only).")
        off1 = r.off.get((1, plan.contexts[0]))
        if r.hf:
            lines += ["", f"### Hugging Face transformers, batch 1, context "
                          f"{512 if not dry else 32} (same dummy weights)", "",
                      "| forward | ms per token | splitspec off step / it |", "|---|---:|---:|"]
            for note, ms in r.hf:
                ratio = None if ms is None or off1 is None else off1.wall_ms / ms
                lines.append(f"| {note} | {fmt(ms)} | {fmt(ratio)}x |")
        if r.eagle and off1 is not None:
            lines += ["", "### EAGLE head of this shape (through the engine, batch 1)", "",
                      "| drafting | steps | drafting ms per step | per drafted token | "
                      "/ off step |", "|---|---:|---:|---:|---:|"]
            for label, k, m in r.eagle:
                per = m["round_trip_ms"] / k
                lines.append(f"| {label} | {m['steps']} | {fmt(m['round_trip_ms'])} | "
                             f"{fmt(per)} | {fmt(per / off1.wall_ms, '.3f')}x |")
        if r.draft and off1 is not None:
            lines += ["", f"### Draft pod ({plan.shapes[0][2]} shape over gRPC, k = {DRAFT_K}, "
                          "batch 1)", "",
                      "| drafting ahead | steps | round trip ms | per drafted token / off step "
                      "| wait per step ms | step ms |", "|---|---:|---:|---:|---:|---:|"]
            for label, m in r.draft:
                lines.append(f"| {label} | {m['steps']} | {fmt(m['round_trip_ms'])} | "
                             f"{fmt(m['round_trip_ms'] / DRAFT_K / off1.wall_ms, '.3f')}x | "
                             f"{fmt(m['wait_ms'])} | {fmt(m['step_ms'])} |")
        proj = projection(r, tps, plan.contexts)
        if proj:
            lines += ["", "### Projected speed-up (batch 1, context "
                          f"{plan.contexts[0]}; projected, not measured)", "",
                      "tokens per step from bench/reports/bench-real.md (the real model on "
                      "the CPU) x off step / (verification step of the next measured row count "
                      "+ drafting measured here).", "",
                      "| method | tokens / step (real model) | rows verified | drafting ms | "
                      "projected speed-up |", "|---|---:|---:|---:|---:|"]
            for name, t, rows, drafting, s in proj:
                lines.append(f"| {name} | {t:.2f} | {rows} | {drafting:.2f} | {s:.2f}x |")
        for note in r.notes:
            lines += ["", f"Note: {note}"]
        lines.append("")
    return lines


async def main_async(args) -> None:
    plan = DRY if args.dry else REAL
    if args.no_hf_compile:
        plan = dataclasses.replace(plan, hf_compile=False)
    device = torch.device("cpu" if args.dry else args.device)
    dtype = torch.float32 if args.dry else torch.bfloat16
    if args.dry:
        torch.set_num_threads(1)
    started = time.perf_counter()
    bandwidth = copy_bandwidth(device, plan.copy_mb)
    tps = real_tokens_per_step(ROOT / "bench" / "reports" / "bench-real.md")
    shapes = plan.shapes if not args.shapes else tuple(
        s for s in plan.shapes if s[0] in args.shapes.split(","))
    results = []
    for target, head, draft in shapes:
        print(f"[gpu-scale] {target} ...", file=sys.stderr, flush=True)
        results.append(await bench_shape(plan, target, head, draft, device, dtype, bandwidth,
                                          args.dry))
    lines = report(results, plan, device, bandwidth, args.dry, tps,
                   time.perf_counter() - started)
    write_markdown(args.out, lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry", action="store_true", help="the CPU, the tiny shape")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", default="", help="comma-separated subset of the shapes")
    ap.add_argument("--no-hf-compile", action="store_true",
                    help="skip torch.compile of the transformers baseline (minutes to compile)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.out is None:
        args.out = str(ROOT / "bench" / "reports" /
                       ("gpu-scale-dry.md" if args.dry else "gpu-scale.md"))
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
