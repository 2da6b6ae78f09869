"""The sampling state's cost and speculation with logits processors on (bench/reports/sampling.md).

    python bench/sampling_bench.py [--model DIR] [--per-group 2] [--max-tokens 64]
                                   [--methods off ngram suffix eagle draft mlp] [--threads 0]

1. Host cost of a step's sampling inputs, per step, at batch 1, 16 and 64 with chains of 4
   drafts (5 rows a sequence) over the model's vocabulary: building them from the sampling state
   (`SamplingState.step` + the per-row SamplingTensors) against repacking every row's parameters
   from Python lists (what the verifier did before the state existed); then the same with
   penalties and a bias on every sequence, the processing of the rows included, beside the
   sampler's own cost (`apply_sampling_params` over the rows) for scale. Medians of interleaved
   repetitions.
2. Each method on Spec-Bench questions (the committed subset, `--per-group` per group, first
   turns, through the chat template), greedy, batch 1, in one in-process engine on the real
   model (each configuration in an engine of its own): tokens/s and accepted tokens per step,
   with frequency_penalty 0.5 and
   presence_penalty 0.5 against without; the outputs with speculation equal off's in both.
"""

from __future__ import annotations

import asyncio
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import bench_parser, markdown_table, write_markdown  # noqa: E402
from specbench_data import ChatPrompts, load, pick  # noqa: E402

from kernels.layout import StepLayout  # noqa: E402
from kernels.sampling import SamplingTensors  # noqa: E402
from splitspec.params import GenerationInput, SamplingParams, SpeculationPlan, StoppingCriteria  # noqa: E402,E501
from splitspec.proposal import Draft  # noqa: E402
from verifier_service.step.sampling_state import SamplingState  # noqa: E402

PENALTIES = dict(frequency_penalty=0.5, presence_penalty=0.5)
K = {"ngram": 4, "suffix": 4, "eagle": 4, "draft": 3, "mlp": 3, "lookahead": 8}


# -- 1. the state's cost ----------------------------------------------------------------------

def _fake(i: int, sampling: SamplingParams, vocab: int):
    prompt = tuple(range(i, i + 200))
    return SimpleNamespace(request_id=f"s{i}", inp=SimpleNamespace(
        sampling=sampling, prompt_token_ids=prompt), tokens=list(prompt) + list(range(50)),
        finished=False, bad_words_ids=(), tracker=SimpleNamespace(stop_token_ids=frozenset()))


def _repacked(params: list[SamplingParams], rows: list[int]) -> SamplingTensors:
    """Before the state: every row's fields from Python lists, per step."""
    def per_row(values):
        return [v for v, n in zip(values, rows) for _ in range(n)]

    return SamplingTensors.from_lists(
        per_row([p.temperature for p in params]), per_row([p.top_k for p in params]),
        per_row([p.top_p for p in params]), per_row([p.min_p for p in params]))


def _median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def state_cost(vocab: int, reps: int) -> list[list[object]]:
    out = []
    for batch in (1, 16, 64):
        k = 4
        layout = StepLayout.build([k + 1] * batch, [249] * batch, [k] * batch, [True] * batch)
        logits = torch.randn(batch * (k + 1), vocab)
        for label, extra in (("no processor", {}), ("penalties + bias", dict(
                **PENALTIES, logit_bias=((5, 2.0), (9, -3.0))))):
            sampling = SamplingParams(temperature=0.8, top_p=0.9, **extra)
            seqs = [_fake(i, sampling, vocab) for i in range(batch)]
            drafts = [Draft(s.request_id, [7, 8, 9, 10]) for s in seqs]
            state = SamplingState(vocab, torch.device("cpu"))

            def from_state():
                step = state.step(seqs, drafts, layout)
                step.row_tensors()
                return step.process(logits)

            def repack():
                return _repacked([s.inp.sampling for s in seqs], [k + 1] * batch)

            sampler = _repacked([sampling] * batch, [k + 1] * batch)
            times = {"state": [], "repack": []}
            for _ in range(3):  # interleaved rounds
                times["state"].append(_median_ms(from_state, reps))
                times["repack"].append(_median_ms(repack, reps))
            apply_ms = _median_ms(lambda: sampler.apply(logits), max(3, reps // 10))
            s, r = statistics.median(times["state"]), statistics.median(times["repack"])
            out.append([batch, label, f"{r:.3f}", f"{s:.3f}", f"{apply_ms:.2f}",
                        f"{s / apply_ms:.1%}"])
    return out


# -- 2. each method with penalties on ------------------------------------------------------------

def _engine(model: str, threads: int, methods: list[str]):
    from proposer_service.config import ProposerConfig
    from proposer_service.server import build_proposer
    from splitspec.config import parse_config
    sys.path.insert(0, str(ROOT / "tests/verifier_service"))  # the in-process transport
    from proposer_testlib import InProcessProposerClient

    from verifier_service.config import VerifierConfig
    from verifier_service.server import build_engine

    proposers = {}
    for method in methods:
        if method in ("ngram", "suffix"):
            flags = ["--method", method]
        elif method in ("draft", "mlp"):
            flags = ["--method", method, "--model", f"{model}-{_dirname(method)}",
                     "--device", "cpu"] + (["--tokenizer", model] if method == "mlp" else [])
        else:
            continue
        proposers[method] = InProcessProposerClient(
            build_proposer(parse_config(ProposerConfig, flags)))
    eagle = f"{model}-eagle" if "eagle" in methods else ""
    config = VerifierConfig(model=model, threads=threads, eagle=eagle, max_num_seqs=4)
    engine, *_ = build_engine(config, proposers)
    return engine


def _dirname(method: str) -> str:
    return {"draft": "draft", "mlp": "mlp-speculator"}[method]


async def _serve(engine, inputs):
    out = []
    for inp in inputs:  # batch 1: one request at a time
        tokens, last = [], None
        t = time.perf_counter()
        async for o in engine.generate(inp):
            tokens += o.token_ids
            last = o
        out.append((tokens, time.perf_counter() - t, last.usage))
    return out


def methods_with_penalties(model: str, per_group: int, max_tokens: int, methods: list[str],
                           threads: int) -> tuple[list[list[object]], str]:
    """Each (method, fields) in an engine of its own (a suffix tree would otherwise copy the
    same questions' answers from an earlier configuration), two rounds in reversed order."""
    tokenizer_engine = _engine(model, threads, ["off"])
    prompts = ChatPrompts(tokenizer_engine.tokenizer)
    questions = pick(load(), per_group)
    ids = [tuple(prompts.ids(list(q.turns), [])) for q in questions]
    results = {}

    def inputs(method, sampling, tag):
        plan = SpeculationPlan(method, K[method]) if method != "off" else SpeculationPlan()
        return [GenerationInput(f"{tag}-{method}-{i}", p, sampling,
                                StoppingCriteria(max_tokens=max_tokens, ignore_eos=True), plan)
                for i, p in enumerate(ids)]

    async def run(method, label, extra, rnd):
        engine = _engine(model, threads, [method])
        engine.start()
        try:
            await _serve(engine, inputs("off", SamplingParams(temperature=0.0), "warm")[:1])
            got = await _serve(engine, inputs(method, SamplingParams(temperature=0.0, **extra),
                                              f"r{rnd}-{label}"))
            results.setdefault((method, label), []).append(got)
        finally:
            await engine.shutdown()

    for rnd in range(2):  # two rounds, the order reversed in the second
        order = [(m, lab, extra) for m in methods
                 for lab, extra in (("none", {}), ("penalties", PENALTIES))]
        for method, label, extra in (order if rnd == 0 else order[::-1]):
            asyncio.run(run(method, label, extra, rnd))
    rows = []
    identical = []
    for label in ("none", "penalties"):
        off = results[("off", label)]
        off_tps = _tps(off)
        for method in methods:
            got = results[(method, label)]
            same = all(a[0] == b[0] for r, o in zip(got, off) for a, b in zip(r, o))
            identical.append(same)
            steps = sum(u.steps for r in got for _, _, u in r)
            tokens = sum(len(t) for r in got for t, _, _ in r)
            acc = sum(u.accepted_tokens for r in got for _, _, u in r)
            prop = sum(u.proposed_tokens for r in got for _, _, u in r)
            rows.append([method, label, f"{_tps(got):.1f}", f"{_tps(got) / off_tps:.2f}x",
                         f"{tokens / steps:.2f}", f"{acc / prop:.2f}" if prop else "-",
                         "yes" if same else "NO"])
    return rows, "yes" if all(identical) else "NO"


def _tps(rounds) -> float:
    tokens = sum(len(t) for r in rounds for t, _, _ in r)
    seconds = sum(s for r in rounds for _, s, _ in r)
    return tokens / seconds


def main() -> None:
    ap = bench_parser(__doc__)
    ap.set_defaults(model=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--per-group", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--methods", nargs="+",
                    default=["off", "ngram", "suffix", "eagle", "draft", "mlp"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--reps", type=int, default=50, help="repetitions per cost measurement")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/sampling.md"))
    ap.add_argument("--skip-methods", action="store_true", help="the state's cost only")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(args.model, local_files_only=True).vocab_size
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Sampling state and logits processors ({started})", "",
             f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads, "
             f"torch {torch.__version__}. Command: `python bench/sampling_bench.py "
             f"{' '.join(sys.argv[1:])}`.", "",
             "## A step's sampling inputs, host cost per step", "",
             f"Chains of 4 drafts (5 rows a sequence) over a vocabulary of {vocab}; the "
             "sampler's own cost (`apply_sampling_params` over the same rows) for scale; "
             f"medians of {args.reps} repetitions, three interleaved rounds.", ""]
    lines += markdown_table({"batch": "r", "requests": "l", "repacked lists (ms)": "r",
                             "sampling state (ms)": "r", "sampler (ms)": "r",
                             "state / sampler": "r"}, state_cost(vocab, args.reps))
    if not args.skip_methods:
        rows, identical = methods_with_penalties(args.model, args.per_group, args.max_tokens,
                                                 args.methods, args.threads)
        lines += ["", "## Each method with penalties on", "",
                  f"Spec-Bench's committed subset, {args.per_group} first turns per group, "
                  f"greedy, batch 1, {args.max_tokens} tokens each (ignore_eos), each "
                  "configuration in an engine of its own, two rounds; `penalties`: "
                  "frequency_penalty 0.5 and presence_penalty 0.5. Speed-up against off with "
                  "the same fields. Output "
                  f"identical to off's in every row: {identical}.", ""]
        lines += markdown_table({"method": "l", "fields": "l", "tok/s": "r", "vs off": "r",
                                 "tokens/step": "r", "acceptance": "r", "= off": "l"}, rows)
    write_markdown(args.out, lines)


if __name__ == "__main__":
    main()
