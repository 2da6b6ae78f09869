"""Structured outputs on the real model (bench/reports/structured.md).

    python bench/structured_bench.py [--model DIR] [--schemas 20] [--max-tokens 128]
                                     [--configs off ngram suffix grammar ...] [--threads 0]

The committed JSONSchemaBench subset (bench/data/jsonschemabench), its first `--schemas`
schemas taken in turn from each set (Glaiveai2K, GitHub easy, GitHub medium); each prompt asks
the chat model, through its chat template, for one JSON instance of the schema, and the request
holds its output to the schema (a structured request, as `response_format: json_schema` makes
it). Greedy, up to `--max-tokens` new tokens, each configuration in an in-process engine
of its own (the proposers in process too), at batch 1 (one request at a time) and with 16
requests in flight. Per
configuration (off, n-gram, suffix, the grammar's forced tokens, hybrids with the grammar
first, EAGLE): compliance (finished and valid against the schema by jsonschema), tokens per
second and against off's in the same run, tokens per step, draft tokens pruned by the grammar,
forced draft tokens proposed and accepted, and whether the output equals off's. In the same
run, Hugging Face generate with xgrammar's logits processor (xgrammar.contrib.hf) at batch 1 on
the same prompts and the same compiled grammars; and the grammar mask's own cost (the host fill
and the apply of one step's bitmask, bench/grammar_mask_cost.py) at batch 1 and 16 against the
off step measured in the same run.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import bench_parser, markdown_table, write_markdown  # noqa: E402
from grammar_mask_cost import mask_seconds  # noqa: E402
from specbench_data import ChatPrompts  # noqa: E402

from splitspec.params import (  # noqa: E402
    GenerationInput,
    SamplingParams,
    SpeculationPlan,
    StoppingCriteria,
    StructuredKind,
    StructuredOutput,
)

DATA = ROOT / "bench/data/jsonschemabench/schemas.jsonl"
SETS = ("Glaiveai2K", "Github_easy", "Github_medium")
PROMPT = ("Write one JSON object that is valid against this JSON schema. Reply with the JSON "
          "only.\n\nSchema:\n{schema}")
K = {"ngram": 4, "suffix": 4, "eagle": 4, "grammar": 8, "hybrid:grammar+ngram": 8,
     "hybrid:grammar+suffix": 8, "hybrid:grammar+eagle": 8}
CONFIGS = ["off", "ngram", "suffix", "grammar", "hybrid:grammar+ngram", "hybrid:grammar+suffix",
           "eagle", "hybrid:grammar+eagle"]
CONCURRENT = 16
MASK_GOALS = {1: 0.05, CONCURRENT: 0.10}  # the mask's cost, at most this share of the off step


def schemas(count: int) -> list[dict]:
    """The first `count` schemas taken in turn from each set."""
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    by_set = {s: [r for r in rows if r["set"] == s] for s in SETS}
    out = []
    while len(out) < count and any(by_set.values()):
        for s in SETS:
            if by_set[s] and len(out) < count:
                out.append(by_set[s].pop(0))
    return out


def complies(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text, strict=False), schema)
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True


def _engine(model: str, threads: int, configs: list[str]):
    from proposer_service.config import ProposerConfig
    from proposer_service.server import build_proposer
    from splitspec.config import parse_config
    from splitspec.methods import components_of
    sys.path.insert(0, str(ROOT / "tests/verifier_service"))  # the in-process transport
    from proposer_testlib import InProcessProposerClient

    from verifier_service.config import VerifierConfig
    from verifier_service.server import build_engine

    wanted = {m for c in configs for m in components_of(c)}
    proposers = {m: InProcessProposerClient(build_proposer(parse_config(
        ProposerConfig, ["--method", m]))) for m in ("ngram", "suffix") if m in wanted}
    eagle = f"{model}-eagle" if "eagle" in wanted else ""
    config = VerifierConfig(model=model, threads=threads, eagle=eagle,
                            max_num_seqs=CONCURRENT)
    engine, *_ = build_engine(config, proposers)
    return engine


async def _one(engine, inp):
    tokens, text, last = [], "", None
    async for o in engine.generate(inp):
        tokens += o.token_ids
        text += o.text
        last = o
    return tokens, text, last


async def _serve(engine, inputs, concurrency: int):
    """Every request, `concurrency` in flight; (outputs, seconds for all)."""
    gate = asyncio.Semaphore(concurrency)

    async def gated(inp):
        async with gate:
            return await _one(engine, inp)

    start = time.perf_counter()
    out = await asyncio.gather(*(gated(i) for i in inputs))
    return out, time.perf_counter() - start


def _counters(engine) -> tuple[float, float, float, float, float]:
    """(pruned drafts, forced tokens drafted, of those accepted, steps, their seconds)."""
    s = engine.snapshot()
    forced = s.in_target.get("grammar", {})
    return (s.grammar_pruned_tokens, forced.get("forced_tokens_total", 0),
            forced.get("forced_tokens_accepted_total", 0), s.steps, s.step_seconds_total)


def run_engine(model: str, cases: list[dict], max_tokens: int, configs: list[str],
               threads: int) -> tuple[dict, list[list[int]], list]:
    """Each (configuration, concurrency) in an engine of its own, so that none drafts from what
    an earlier one served (the suffix proposer's tree keeps every answer it saw: the same
    prompts' answers from an earlier configuration would be copied whole)."""
    results, grammars, ids = {}, [], []
    structured = [StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(c["schema"]))
                  for c in cases]

    def inputs(config, tag):
        plan = SpeculationPlan(config, K[config]) if config != "off" else SpeculationPlan()
        return [GenerationInput(f"{tag}-{config}-{i}", p,
                                SamplingParams(temperature=0.0, structured=s),
                                StoppingCriteria(max_tokens=max_tokens), plan)
                for i, (p, s) in enumerate(zip(ids, structured))]

    async def run(engine, config, concurrency):
        engine.start()
        try:
            # warm-up on another prompt (the model's first forwards; no answer to copy later)
            warm = GenerationInput("warm", tuple(engine.tokenizer.encode("Hello")),
                                   SamplingParams(temperature=0.0), StoppingCriteria(max_tokens=4))
            await _serve(engine, [warm], 1)
            for s in structured:  # compiled before the clock starts, as a warm cache holds them
                grammar = await engine.grammars.compile(s)
                if len(grammars) < len(structured):
                    grammars.append(grammar)
            before = _counters(engine)
            out, seconds = await _serve(engine, inputs(config, f"c{concurrency}"), concurrency)
            after = _counters(engine)
            results[(config, concurrency)] = (out, seconds,
                                              [a - b for a, b in zip(after, before)])
        finally:
            await engine.shutdown()

    for concurrency in (1, CONCURRENT):
        for config in configs:
            engine = _engine(model, threads, [config])
            if not ids:
                prompts = ChatPrompts(engine.tokenizer)
                ids.extend(tuple(prompts.ids([PROMPT.format(schema=json.dumps(c["schema"]))],
                                             [])) for c in cases)
            asyncio.run(run(engine, config, concurrency))
    return results, [list(p) for p in ids], grammars


def run_hf(model: str, prompt_ids: list[list[int]], grammars, max_tokens: int, eos: int):
    """Hugging Face generate with xgrammar's logits processor, greedy, batch 1."""
    import xgrammar as xgr
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, local_files_only=True,
                                              dtype=torch.float32)
    with torch.no_grad():  # warm-up, untimed (the first generate pays for its set-up)
        hf.generate(torch.tensor([prompt_ids[0]]), max_new_tokens=4, do_sample=False,
                    logits_processor=[xgr.contrib.hf.LogitsProcessor(grammars[0])],
                    pad_token_id=eos, eos_token_id=eos)
    out, seconds = [], 0.0
    for ids, grammar in zip(prompt_ids, grammars):
        x = torch.tensor([ids])
        start = time.perf_counter()
        with torch.no_grad():
            y = hf.generate(x, max_new_tokens=max_tokens, do_sample=False,
                            logits_processor=[xgr.contrib.hf.LogitsProcessor(grammar)],
                            pad_token_id=eos, eos_token_id=eos)
        seconds += time.perf_counter() - start
        out.append(y[0, x.shape[1]:].tolist())
    return out, seconds


def main() -> None:
    ap = bench_parser(__doc__)
    ap.set_defaults(model=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--schemas", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--configs", nargs="+", default=CONFIGS)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--hf-schemas", type=int, default=5,
                    help="Hugging Face generate on the first this many schemas (0: none)")
    ap.add_argument("--mask-reps", type=int, default=50,
                    help="repetitions of the grammar mask's fill and apply (0: not measured)")
    ap.add_argument("--note", default="", help="a line on the machine, under the title")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/structured.md"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if "off" not in args.configs:
        args.configs.insert(0, "off")
    cases = schemas(args.schemas)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results, prompt_ids, grammars = run_engine(args.model, cases, args.max_tokens,
                                               args.configs, args.threads)
    off_texts = {c: [t for t, _, _ in results[("off", c)][0]] for c in (1, CONCURRENT)}
    rows = []
    for concurrency in (1, CONCURRENT):
        off_tps = None
        for config in args.configs:
            out, seconds, (pruned, forced, forced_ok, *_) = results[(config, concurrency)]
            tokens = sum(len(t) for t, _, _ in out)
            steps = sum(last.usage.steps for _, _, last in out)
            tps = tokens / seconds
            off_tps = off_tps or tps
            ok = sum(last.finish_reason == "stop" and complies(text, c["schema"])
                     for (_, text, last), c in zip(out, cases))
            length = sum(last.finish_reason == "length" for _, _, last in out)
            same = [t for t, _, _ in out] == off_texts[concurrency]
            rows.append([config, concurrency, f"{ok}/{len(cases)}", length, f"{tps:.1f}",
                         f"{tps / off_tps:.2f}x", f"{tokens / steps:.2f}", int(pruned),
                         f"{int(forced_ok)}/{int(forced)}" if forced else "-",
                         "yes" if same else "NO"])
    lines = [f"# Structured outputs on the real model ({started})", ""]
    if args.note:
        lines += [args.note, ""]
    lines += [f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, "
              f"{torch.get_num_threads()} torch threads, torch {torch.__version__}. Command: "
              f"`python bench/structured_bench.py {' '.join(sys.argv[1:])}`. Model: "
              f"{Path(args.model).name}.", "",
              f"{len(cases)} schemas of the committed JSONSchemaBench subset "
              "(bench/data/jsonschemabench), taken in turn from Glaiveai2K, GitHub easy and "
              "GitHub medium; the prompt asks for one JSON instance of the schema through the "
              f"chat template; greedy, at most {args.max_tokens} new tokens, each request "
              "held to its schema (compact JSON). Each configuration and concurrency in an "
              "in-process engine of its own, grammars compiled before the clock starts; "
              "`concurrency` is the requests in flight (1: one after another). `compliant`: "
              "finished (`stop`) and "
              "valid by jsonschema; `length`: cut at max_tokens. `pruned`: draft tokens the "
              "grammar refused before the step; `forced`: the grammar drafter's forced tokens "
              "accepted / proposed. `= off`: every output equals off's token for token.", ""]
    lines += markdown_table({"config": "l", "concurrency": "r", "compliant": "r",
                             "length": "r", "tok/s": "r", "vs off": "r", "tokens/step": "r",
                             "pruned": "r", "forced": "r", "= off": "l"}, rows)
    if args.mask_reps:
        lines += mask_section(results, grammars, args.mask_reps)
    n_hf = min(args.hf_schemas, len(cases))
    if n_hf:
        eos = _eos(args.model)
        hf_out, hf_seconds = run_hf(args.model, prompt_ids[:n_hf], grammars[:n_hf],
                                    args.max_tokens, eos)
        hf_tokens = sum(len(t) for t in hf_out)
        engine_off = results[("off", 1)][0][:n_hf]
        same = sum(h == t for h, (t, _, _) in zip(hf_out, engine_off))
        ok = sum(complies(_text(args.model, h), c["schema"]) for h, c in zip(hf_out, cases))
        lines += ["", "## Hugging Face generate with xgrammar's logits processor", "",
                  f"The first {n_hf} prompts and their compiled grammars, `model.generate` "
                  "(greedy, batch 1, float32, one untimed warm-up call) with "
                  "`xgrammar.contrib.hf.LogitsProcessor`. Its tok/s against the engine's "
                  "batch-1 rows is a comparison of whole runs on different prompts counts "
                  "(the engine's rows cover every schema).", ""]
        lines += markdown_table(
            {"": "l", "compliant": "r", "tok/s": "r", "outputs equal to the engine's off": "r"},
            [["Hugging Face + xgrammar", f"{ok}/{n_hf}", f"{hf_tokens / hf_seconds:.1f}",
              f"{same}/{n_hf}"]])
    write_markdown(args.out, lines)


def mask_section(results: dict, grammars: list, reps: int) -> list[str]:
    """The grammar mask's fill and apply per step at batch 1 and CONCURRENT, against the off
    step of the same run (its step seconds over its steps, at that concurrency)."""
    outputs = [t for t, _, _ in results[("off", 1)][0]]
    vocab = grammars[0].tokenizer_info.vocab_size
    rows = []
    threads = torch.get_num_threads()
    for batch in (1, CONCURRENT):
        out, _, counters = results[("off", batch)]
        steps, step_s = counters[3], counters[4]
        off_step = step_s / steps
        tokens = sum(len(t) for t, _, _ in out)
        for n in sorted({threads, 1}, reverse=True):
            fill, apply = mask_seconds(grammars, outputs, vocab, batch, reps, threads=n)
            share = (fill + apply) / off_step
            rows.append([batch, n, f"{fill * 1e3:.3f}", f"{apply * 1e3:.3f}",
                         f"{(fill + apply) * 1e3:.3f}",
                         f"{off_step * 1e3:.1f} ({tokens / steps:.1f})", f"{share:.1%}",
                         f"{MASK_GOALS[batch]:.0%}",
                         "yes" if share <= MASK_GOALS[batch] else "no"])
    lines = ["", "## The grammar mask's own cost", "",
             "Per step, measured apart from the step (bench/grammar_mask_cost.py): `fill` is "
             "the host bitmask of the step's rows, one per sequence as off verifies them, each "
             "written by its request's matcher (the bench's compiled grammars, each advanced "
             "through the first half of its off output); `apply` unpacks it to the banned "
             "tokens and masks the logits with -inf. Medians of "
             f"{reps} repetitions, on the run's torch threads (the engine's) and on one "
             "(`threads`): the apply's element-wise operations run on torch's intra-op pool, "
             "where each waits for its slowest thread when other processes hold the cores. "
             "`off step`: the off configuration's step seconds over its "
             "steps at that concurrency in this run, with its mean sequences per step in "
             "brackets (below the batch where requests drain at the end).", ""]
    return lines + markdown_table(
        {"batch": "r", "threads": "r", "fill ms": "r", "apply ms": "r", "mask ms": "r",
         "off step ms (seqs)": "r", "mask / off step": "r", "goal": "r", "met": "l"}, rows)


def _text(model: str, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, local_files_only=True).decode(
        ids, skip_special_tokens=True)


def _eos(model: str) -> int:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, local_files_only=True).eos_token_id


if __name__ == "__main__":
    main()
