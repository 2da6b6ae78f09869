"""The accelerator benchmark (`make bench-gpu`): the whole stack on one CUDA GPU, with the
models the repository ships, in one run of about ten minutes.

    python3 bench/gpu_bench.py                   # on a CUDA machine: bench/reports/gpu.md
    python3 bench/gpu_bench.py --device cpu --quick --out bench/out/gpu-dry.md
                                                 # the same script end to end on the CPU

It needs no network and uses the torch it finds (not the CPU build `make` pins): the service
packages travel as wheels where the machine lacks them (docs/benchmarking.md says how).

Reported, for one model family per run (`--model`: default models/target, the toy family;
models/smollm2-135m-instruct for the real model once imported), with the draft, MLP speculator
and EAGLE head found beside its target:
  * start-up: each service's time to SERVING (the verifier's graph capture and warm-up apart,
    from its log), and the step graphs it captured;
  * the warm-up curve: the first requests after SERVING, each one's tokens/s;
  * three passes over the same prompts (batch 1, greedy): speculation off, every method at
    k 3/5/8, token trees, lookahead at three shapes and auto; per pass tokens/s and the ratio
    to off, with their spread over the passes (coefficient of variation), tokens per step and
    the step time split (verify, propose, network ms per step);
  * one pass of seeded sampled requests (T 0.8) through off and every chain at the smallest k:
    output identical on and off (sampled drafting replays the captured loops);
  * Hugging Face `generate` on the same device and dtype (eager, dynamic cache, no compile):
    plain, assisted by the draft, prompt lookup;
  * concurrency 16 and 64 (the verifier's --max-num-seqs raised to match): off, the best
    method of the passes, EAGLE's smallest chain (a step's chains replay together) and auto,
    aggregate tokens/s;
  * how steps ran: captured share of steps and of tokens, eager steps by reason, from the
    verifier's metrics;
  * on CUDA, one decode step of a captured bucket under torch.cuda.set_sync_debug_mode("error")
    in this process: no hidden sync (GPU-only; the CPU run says so).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import device_dtype, device_parser, write_markdown  # noqa: E402
from bench_report import auto_choices, split_ms, summarize  # noqa: E402
from compare_bench import Config, HfBaselines, SplitspecClient, machine_facts  # noqa: E402
from spec_bench import held_out_prompts  # noqa: E402

from splitspec.launcher import Stack, StackConfig, sibling_proposer_models  # noqa: E402
from splitspec.methods import METHODS  # noqa: E402

KS = (3, 5, 8)
TREES = {"ngram": 3, "draft": 2, "mlp": 2, "eagle": 4}
SHAPES = ((3, 3, 2), (5, 3, 5), (8, 4, 8))  # lookahead (W, N, G)


def lookahead_nodes(shape: tuple[int, int, int]) -> int:
    """The node budget lookahead needs for its window and all its guesses."""
    w, n, g = shape
    return (w + g) * (n - 1)


def configs(served: list[str], quick: bool) -> list[Config]:
    ks = (KS[0],) if quick else KS
    out = [Config("splitspec", "off", 0.0)]
    for m in ("ngram", "draft", "mlp", "suffix", "eagle"):
        if m in served:
            out += [Config("splitspec", m, 0.0, k) for k in ks]
    for m, b in TREES.items():
        if m in served:
            out.append(Config("splitspec", m, 0.0, 8, branches=b))
    shapes = SHAPES[:1] if quick else SHAPES
    out += [Config("splitspec", "lookahead", 0.0, lookahead_nodes(s), lookahead=s)
            for s in shapes]
    out.append(Config("splitspec", "auto", 0.0))
    return out


def stack_config(args, models, max_num_seqs: int, log_name: str) -> StackConfig:
    k_max = max(lookahead_nodes(s) for s in SHAPES)
    dtype = ["--dtype", args.dtype]
    # suffix is left out: a host-side index the bench restarts before each of its runs (a
    # cross-request method must not have seen the prompt), seconds each; `make bench` has it
    methods = [m for m in METHODS if m != "suffix"]
    return StackConfig.with_free_ports(
        model=args.model, device=args.device, models=models, methods=methods,
        proposer_args={m: dtype for m in ("draft", "mlp")},
        log_dir=ROOT / "bench/out/gpu-logs" / log_name,
        verifier_args=["--proposer-timeout-ms", "2000", "--max-num-seqs", str(max_num_seqs),
                       "--max-num-speculative-tokens", str(k_max), *dtype])


def startup_lines(stack: Stack, seconds: float) -> list[str]:
    """Start-up time, the verifier's own account of it, and its warm-up parts (its log)."""
    lines = [f"- whole stack to SERVING: {seconds:.1f} s"]
    log = stack.config.log_dir / "verifier.log" if stack.config.log_dir else None
    text = log.read_text(errors="replace") if log and log.exists() else ""
    for pattern in (r"captured \d+ step graphs.*", r"warm-up took .*", r"ready in .*"):
        found = re.findall(pattern, text)
        if found:
            lines.append(f"- verifier: {found[-1].strip()}")
    return lines


def tok_s(runs) -> float:
    tokens = sum(len(r.tokens) for r in runs)
    secs = sum(r.elapsed for r in runs)
    return tokens / secs if secs else 0.0


def tokens_per_step(runs) -> float:
    steps = sum(r.usage.speculation.steps for r in runs if r.usage is not None)
    tokens = sum(len(r.tokens) for r in runs)
    return tokens / steps if steps else float("nan")


def step_split(cfg: Config, runs) -> str:
    """Mean verify / propose / network ms per step over runs (the verifier's and proposers'
    metrics; bench_report.split_ms)."""
    split = split_ms(summarize(cfg, runs))
    if split is None:
        return "-"
    return " / ".join(f"{split[k]:.2f}" for k in ("verify", "propose", "network"))


def hf_lines(args, models, prompts, off_tok_s: float, passes) -> list[str]:
    """HF generate plain / assisted (the draft) / prompt lookup on the same device and dtype,
    with splitspec off (mean of the passes) and the draft's best k against them. On CUDA
    twice: with torch's default attention backends, and with cuDNN's SDPA taken out as the
    services run (splitspec.device.shape_stable_attention); splitspec is set against the
    faster of the two."""
    import torch

    hf = HfBaselines(args.model, models.get("draft"), args.device, args.dtype)
    lines = ["## Hugging Face generate on the same device (eager, dynamic cache)", "",
             "| configuration | attention backends | tok/s | splitspec against it |",
             "|---|---|---:|---|"]
    drafts = [c for c in passes[0] if c.name == "draft" and c.branches == 1]
    draft_best = max(drafts, key=lambda c: statistics.mean(tok_s(p[c]) for p in passes),
                     default=None)
    cudnn = torch.backends.cuda.cudnn_sdp_enabled()
    settings = ((True, "torch default"), (False, "cuDNN SDPA off")) if args.device == "cuda" \
        else ((cudnn, "torch default"),)
    try:
        for name in ("plain", "assisted", "prompt_lookup"):
            if name == "assisted" and hf.draft is None:
                continue
            cfg = Config("hf", name, 0.0)
            speeds = {}
            for enabled, label in settings:
                torch.backends.cuda.enable_cudnn_sdp(enabled)
                hf.run(cfg, prompts[0], 8)
                speeds[label] = tok_s([hf.run(cfg, p, args.max_tokens) for p in prompts])
            best = max(speeds.values())
            if name == "plain":
                versus = f"off {off_tok_s / best:.2f}x"
            elif name == "assisted" and draft_best is not None:
                mine = statistics.mean(tok_s(p[draft_best]) for p in passes)
                versus = f"{draft_best.label} {mine / best:.2f}x"
            else:
                versus = "-"
            for label, speed in speeds.items():
                lines.append(f"| {cfg.label} | {label} | {speed:.1f} | "
                             f"{versus if speed == best else ''} |")
    finally:
        torch.backends.cuda.enable_cudnn_sdp(cudnn)
    del hf
    return lines + [""]


def sdpa_lines(args) -> list[str]:
    """Masked SDPA at new key lengths (the shapes an EAGLE head's or an eager draft's step
    makes, bf16, one query row), with cuDNN's SDPA allowed and taken out: the first call of
    each length, ms (CUDA only)."""
    import torch
    import torch.nn.functional as F

    if args.device != "cuda" or not torch.cuda.is_available():
        return []
    was = torch.backends.cuda.cudnn_sdp_enabled()
    out = ["## Masked attention at new lengths (first call of each, ms)", "",
           "| backends | query rows | key lengths | median ms | max ms |",
           "|---|---:|---|---:|---:|"]
    try:
        base = 300
        for enabled, label in ((True, "cuDNN allowed"), (False, "cuDNN off")):
            torch.backends.cuda.enable_cudnn_sdp(enabled)
            for rows in (1, 4):
                times = []
                for n in range(base, base + 12):
                    q = torch.randn(1, 8, rows, 64, device="cuda", dtype=torch.bfloat16)
                    k = torch.randn(1, 8, n, 64, device="cuda", dtype=torch.bfloat16)
                    mask = torch.ones(1, 1, rows, n, device="cuda", dtype=torch.bool)
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    F.scaled_dot_product_attention(q, k, k, attn_mask=mask)
                    torch.cuda.synchronize()
                    times.append(1000 * (time.perf_counter() - t))
                out.append(f"| {label} | {rows} | {base}..{base + 11} | "
                           f"{statistics.median(times):.2f} | {max(times):.2f} |")
                base += 12
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
    return out + [""]


SEED_TEMPERATURE = 0.8


def seeded_lines(client: SplitspecClient, cfgs: list[Config], prompts: list[str],
                 max_tokens: int) -> list[str]:
    """One pass of seeded sampled requests (T 0.8, a seed per prompt) through every chain
    configuration at its smallest k and off: the output must be identical on and off (drafts
    drawn inside the captured loops with the keyed noise included)."""
    chains = [c for c in cfgs if c.name not in ("off", "auto", "lookahead")
              and c.branches == 1 and c.k == KS[0]]
    seeded = [dataclasses.replace(c, temperature=SEED_TEMPERATURE) for c in
              [Config("splitspec", "off", 0.0)] + chains]
    runs = {c: [] for c in seeded}
    for i, prompt in enumerate(prompts):
        for c in seeded:
            client.forget_other_runs(c)
            runs[c].append(client.run(dataclasses.replace(c, seed=1000 + i), prompt, max_tokens))
    off = seeded[0]
    lines = [f"## Seeded sampling (T {SEED_TEMPERATURE}, one seed per prompt), one pass", "",
             "| configuration | tok/s | x off | tokens / step | identical to off |",
             "|---|---:|---:|---:|---|"]
    for c in seeded:
        same = all(r.tokens == o.tokens for r, o in zip(runs[c], runs[off]))
        lines.append(f"| {c.label} | {tok_s(runs[c]):.1f} | "
                     f"{tok_s(runs[c]) / tok_s(runs[off]):.2f} | "
                     f"{tokens_per_step(runs[c]):.2f} | {'yes' if same else 'NO'} |")
    return lines + [""]


def cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.mean(values) if len(values) > 1 else 0.0


def concurrent_tok_s(client: SplitspecClient, cfg: Config, prompts: list[str], n: int,
                     max_tokens: int) -> tuple[float, list]:
    """n requests at once (prompts cycled): aggregate tokens/s, and the runs."""
    jobs = [prompts[i % len(prompts)] for i in range(n)]
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(n) as pool:
        runs = list(pool.map(lambda p: client.run(cfg, p, max_tokens), jobs))
    return sum(len(r.tokens) for r in runs) / (time.perf_counter() - start), runs


def executor_lines(client: SplitspecClient) -> list[str]:
    """The verifier's step executor counters (splitspec_step_executor_*)."""
    scraped = client.probe.scrape("verifier")
    steps = {labels: v for (name, labels), v in scraped.items()
             if name == "splitspec_step_executor_steps_total"}
    tokens = {labels: v for (name, labels), v in scraped.items()
              if name == "splitspec_step_executor_tokens_total"}
    total_s, total_t = sum(steps.values()), sum(tokens.values())
    cap_s = sum(v for labels, v in steps.items() if dict(labels).get("mode") == "captured")
    cap_t = sum(v for labels, v in tokens.items() if dict(labels).get("mode") == "captured")
    lines = [f"- steps captured: {cap_s:.0f} of {total_s:.0f} "
             f"({cap_s / total_s:.0%})" if total_s else "- no steps counted",
             f"- fed rows captured: {cap_t:.0f} of {total_t:.0f} "
             f"({cap_t / total_t:.0%})" if total_t else "- no rows counted"]
    for labels, v in sorted(steps.items()):
        d = dict(labels)
        if d.get("mode") == "eager":
            lines.append(f"- eager steps, reason {d.get('reason')}: {v:.0f}")
    sampler = {dict(labels).get("mode"): v for (name, labels), v in scraped.items()
               if name == "splitspec_step_executor_sampler_steps_total"}
    if sampler:
        lines.append(f"- sampled steps with nothing to verify, by the step sampler: "
                     f"{sampler.get('captured', 0):.0f} replayed, {sampler.get('eager', 0):.0f} "
                     f"eager")
    head = {name.removeprefix("splitspec_in_target_").removesuffix("_total"): v
            for (name, labels), v in scraped.items()
            if re.fullmatch(r"splitspec_in_target_(graph|eager)_(chains|trees|advances)_total",
                            name)}
    for what in ("chains", "trees", "advances"):
        if f"graph_{what}" in head or f"eager_{what}" in head:
            kind = {"chains": "chains (greedy and sampled)", "trees": "trees",
                    "advances": "advances over kept rows"}[what]
            lines.append(f"- EAGLE {kind} replayed as graphs: "
                         f"{head.get(f'graph_{what}', 0):.0f}, eager: "
                         f"{head.get(f'eager_{what}', 0):.0f}")
    batches = sum(v for (name, _), v in scraped.items()
                  if name == "splitspec_in_target_chain_batches_total")
    if batches:
        lines.append(f"- EAGLE chains drafted together (a step's sequences in one pass per "
                     f"level): {batches:.0f} batched drafts")
    return lines


def sync_check(args) -> list[str]:
    """Decode steps of an in-process engine under the sync debug mode "error" (CUDA only): a
    plain request (captured buckets), a lookahead one (trees: the eager tree sampler after
    the graph) and, where the model has a head next to it, EAGLE chains greedy, seeded and
    sampled and a tree (the head's drafting and its advance over the kept rows checked too),
    then greedy and seeded sampled EAGLE requests at once (the batched replays).
    Any hidden sync inside a step fails it, and is reported with where it happened."""
    import torch

    if args.device != "cuda" or not torch.cuda.is_available():
        return ["- not run: needs a CUDA device (a GPU-only figure)"]
    import asyncio

    import verifier_service.engine as engine_module
    import verifier_service.methods.eagle.method as eagle_module
    from splitspec.params import GenerationInput, SamplingParams, SpeculationPlan, StoppingCriteria
    from verifier_service.config import VerifierConfig
    from verifier_service.server import build_engine
    from verifier_service.step.warmup import warm_up

    head = Path(f"{args.model}-eagle")
    eagle = str(head) if (head / "config.json").exists() else ""
    engine, *_ = build_engine(VerifierConfig(model=args.model, device="cuda", dtype=args.dtype,
                                             max_num_seqs=4, max_num_speculative_tokens=8,
                                             eagle=eagle), {})
    original, checked, failures = engine_module.verify_step, [0], []
    hooks = {name: getattr(eagle_module.EagleState, name) for name in ("propose", "observe")}

    def checking(fn, where):
        def run(*a, **kw):
            before = torch.cuda.get_sync_debug_mode()  # nested: the step's own check stays on
            torch.cuda.set_sync_debug_mode("error")
            try:
                return fn(*a, **kw)
            except RuntimeError as exc:
                failures.append(f"{where}: {str(exc).splitlines()[0]}")
                raise
            finally:
                torch.cuda.set_sync_debug_mode(before)
        return run

    def strict(executor, batch, *rest):
        if all(s.num_new == 1 for s in batch):  # decode steps
            checked[0] += 1
            return checking(original, "step")(executor, batch, *rest)
        return original(executor, batch, *rest)

    async def run():
        engine.start()
        await warm_up(engine)
        engine_module.verify_step = strict
        for name, fn in hooks.items():
            setattr(eagle_module.EagleState, name, checking(fn, f"eagle {name}"))
        greedy = SamplingParams(temperature=0.0)
        plans = [(SpeculationPlan(), greedy), (SpeculationPlan("lookahead", 8), greedy)]
        plans += [(SpeculationPlan("eagle", 5), greedy),  # sampled chains and trees replay too
                  (SpeculationPlan("eagle", 6, num_branches=2), greedy),
                  (SpeculationPlan("eagle", 5), SamplingParams(temperature=0.8, seed=1)),
                  (SpeculationPlan("eagle", 5), SamplingParams(temperature=0.8))] if eagle else []
        async def one(name: str, plan, sampling, prompt=tuple(range(3, 40))):
            inp = GenerationInput(name, prompt, sampling,
                                  StoppingCriteria(max_tokens=24, ignore_eos=True), plan)
            try:
                async for _ in engine.generate(inp):
                    pass
            except Exception:  # noqa: BLE001 - reported below
                pass

        try:
            for i, (plan, sampling) in enumerate(plans):
                await one(f"sync-{plan.method}-{i}", plan, sampling)
            if eagle:  # a step's chains and advances over several sequences: batched replays
                sampled = [SamplingParams(temperature=0.8, seed=s) for s in (2, 3)]
                together = [(SpeculationPlan("eagle", k), greedy) for k in (3, 4)] + [
                    (SpeculationPlan("eagle", 3), p) for p in sampled]
                for _ in range(2):
                    await asyncio.gather(*(
                        one(f"sync-together-{i}", plan, sampling, tuple(range(3 + i, 40 + i)))
                        for i, (plan, sampling) in enumerate(together)))
        finally:
            engine_module.verify_step = original
            for name, fn in hooks.items():
                setattr(eagle_module.EagleState, name, fn)
            await engine.shutdown()

    asyncio.run(run())
    stats = engine.executor.stats
    verdict = ("none found" if not failures else f"FAILED ({len(failures)}): {failures[0]}")
    chains = ""
    if eagle:
        c = engine.drafts.in_target.methods["eagle"].counters
        chains = (f"; EAGLE chains replayed as graphs {c['graph_chains_total']:.0f}, eager "
                  f"{c['eager_chains_total']:.0f}, advances {c['graph_advances_total']:.0f} "
                  f"and {c['eager_advances_total']:.0f}, batched chain passes "
                  f"{c['chain_batches_total']:.0f} and advances "
                  f"{c['advance_batches_total']:.0f}")
    return [f"- {checked[0]} decode steps ({stats.captured_steps} graph replays{chains}) run "
            f"under torch.cuda.set_sync_debug_mode('error'): hidden syncs {verdict}"]


def main() -> None:
    ap = device_parser(__doc__)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="2 prompts, 16 tokens, one k, one lookahead shape, 2 passes: the script "
                         "end to end in minutes (e.g. on the CPU)")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/gpu.md"))
    args = ap.parse_args()
    args.dtype = device_dtype(args)
    if args.quick:
        args.prompts, args.max_tokens, args.passes = 2, 16, 2
    conc = (4,) if args.quick else (16, 64)
    facts = machine_facts(0, 0)
    prompts = held_out_prompts(args.prompts)
    models = sibling_proposer_models(args.model)
    lines = ["# Accelerator benchmark", "",
             f"`python3 bench/gpu_bench.py {' '.join(sys.argv[1:])}`".rstrip(), "",
             "| machine | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in facts.items()]
    import torch

    device_name = (torch.cuda.get_device_name(0) if args.device == "cuda"
                   and torch.cuda.is_available() else args.device)
    lines += [f"| device | {device_name}, {args.dtype} |", ""]
    if args.device == "cpu":
        lines += ["A dry run on the CPU: it checks the script end to end. Its speeds are this "
                  "CPU's over a few prompts (fewer still with `--quick`), with no graph captured "
                  "(the CPU has none) and beside whatever else the machine runs: the device's "
                  "figures are in bench/reports/gpu.md.", ""]

    def save() -> None:  # after every section: a run cut short keeps what it measured
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(lines) + "\n")
        print(f"[{time.strftime('%H:%M:%S')}] {args.out}: section written", flush=True)

    # first: one engine in this process, captured and stepped under the sync debug mode (a
    # capture that fails shows here, with its traceback, before the stack starts)
    try:
        lines += ["## Hidden syncs", ""] + sync_check(args) + [""]
    except Exception:  # noqa: BLE001 - reported, the rest still runs
        import traceback

        lines += ["## Hidden syncs", "", "```", traceback.format_exc().rstrip(), "```", ""]
    lines += sdpa_lines(args)
    save()
    t0 = time.perf_counter()
    with Stack(stack_config(args, models, max(conc), "main")) as stack:
        up = time.perf_counter() - t0
        client = SplitspecClient(stack)
        lines += ["## Start-up", ""] + startup_lines(stack, up) + [""]
        # the first requests after SERVING, nothing run before them
        off, auto = Config("splitspec", "off", 0.0), Config("splitspec", "auto", 0.0)
        first = [client.run(off, prompts[i % len(prompts)], args.max_tokens)
                 for i in range(10 if not args.quick else 3)]
        lines += ["## First requests after SERVING (speculation off)", "",
                  "| request | tok/s |", "|---:|---:|"]
        lines += [f"| {i + 1} | {tok_s([r]):.1f} |" for i, r in enumerate(first)] + [""]
        save()
        served = sorted([*stack.proposers, *stack.config.in_target_models])  # eagle: a head
        cfgs = configs(served, args.quick)
        passes: list[dict[Config, list]] = []
        for _ in range(args.passes):
            runs = {c: [] for c in cfgs}
            for prompt in prompts:
                for c in cfgs:
                    client.forget_other_runs(c)
                    runs[c].append(client.run(c, prompt, args.max_tokens))
            passes.append(runs)
        lines += [f"## Batch 1, greedy: {args.passes} passes over {len(prompts)} prompts x "
                  f"{args.max_tokens} tokens", "",
                  "| configuration | tok/s per pass | CV | x off per pass | ratio spread | "
                  "tokens / step | verify / propose / network ms per step | identical to off |",
                  "|---|---|---:|---|---:|---:|---|---|"]
        best = None
        for c in cfgs:
            speeds = [tok_s(p[c]) for p in passes]
            ratios = [tok_s(p[c]) / tok_s(p[off]) for p in passes]
            same = all(r.tokens == o.tokens for p in passes for r, o in zip(p[c], p[off]))
            spread = (max(ratios) - min(ratios)) / statistics.mean(ratios)
            lines.append(f"| {c.label} | {' / '.join(f'{s:.1f}' for s in speeds)} | "
                         f"{cv(speeds):.1%} | {' / '.join(f'{r:.2f}' for r in ratios)} | "
                         f"{spread:.1%} | {tokens_per_step(passes[-1][c]):.2f} | "
                         f"{step_split(c, [r for p in passes for r in p[c]])} | "
                         f"{'yes' if same else 'NO'} |")
            if c.name not in ("off", "auto", "lookahead") and (
                    best is None or statistics.mean(ratios) > best[1]):
                best = (c, statistics.mean(ratios))
        lines += [""]
        save()
        lines += seeded_lines(client, cfgs, prompts, args.max_tokens)
        save()
        # Hugging Face in this process while the stack idles (its GPU memory stays held)
        lines += hf_lines(args, models, prompts, off_tok_s=statistics.mean(
            tok_s(p[off]) for p in passes), passes=passes)
        save()
        lines += ["## Concurrency (aggregate tok/s)", "",
                  "| configuration | " + " | ".join(f"{n} clients" for n in conc) + " |",
                  "|---|" + "---:|" * len(conc)]
        chosen = [f"- batch 1 passes: {auto_choices({auto: passes[-1][auto]}, 0.0)}"]
        # EAGLE's smallest chain beside them: its chains over a step's sequences replay
        # together (methods/eagle/batch_graphs.py)
        eagle = next((c for c in cfgs if c.name == "eagle" and c.branches == 1), None)
        extra = [eagle] if eagle is not None and (best is None or eagle != best[0]) else []
        for c in [off] + ([best[0]] if best else []) + extra + [auto]:
            measured = [concurrent_tok_s(client, c, prompts, n, args.max_tokens) for n in conc]
            lines.append(f"| {c.label} | " + " | ".join(f"{s:.0f}" for s, _ in measured) + " |")
            if c == auto:
                chosen += [f"- {n} clients: {auto_choices({auto: runs}, 0.0)}"
                           for n, (_, runs) in zip(conc, measured)]
            save()
        lines += ["", "What `auto` chose (requests per choice, the policy's reason):", ""]
        lines += chosen
        lines += ["", "## How steps ran (verifier metrics over the whole run)", ""]
        lines += executor_lines(client) + [""]
        save()
        client.close()
    write_markdown(args.out, lines)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
