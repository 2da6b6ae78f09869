"""Spec-Bench through the stack (`make bench-specbench`): the field's benchmark, group by group,
on the real chat model, with Spec-Bench's arithmetic.

    python bench/specbench.py [--model DIR] [--per-group 5 | --all] [--max-new-tokens 256]
        [--configs off ngram suffix ...] [--config 'KEY={"mode": "on", ...}@METHOD,...']
        [--repeat suffix] [--seeded [GROUP ...]] [--seeded-max-new-tokens N]
        [--out bench/reports/specbench.md] [--results PATH] [--resume]

Questions: bench/data/spec_bench/question.jsonl (a held-out quarter of Spec-Bench's 480), N per
group (--per-group, default 5; --all: every one), each through the model's chat template; an
MT-bench question's second turn is conditioned on the configuration's own first answer, as
Spec-Bench does (bench/specbench_data.py). Greedy, batch 1 (one request at a time), each answer
until EOS or --max-new-tokens (Spec-Bench: 1024). The same prompt ids go to every system.

Systems, in one run, one after the other, nothing else running:
  * Hugging Face transformers `generate` on the same weights, plain greedy: Spec-Bench's baseline;
  * splitspec through gateway -> verifier -> proposers (gRPC on 127.0.0.1), each configuration
    (bench/specbench_configs.py) in a stack started for it and stopped after it, as Spec-Bench
    runs each method in a process of its own: the suffix proposer remembers every answer it
    served and the verifier what it measured, so a configuration run after others on the same
    questions would draft their answers back. One extra row (--repeat, default suffix) runs a
    configuration's questions a second time on its stack, after its first pass: the
    repeated-question case, labelled as such, not a configuration of its own.

Reported (bench/specbench_report.py, arithmetic in bench/specbench_speed.py): Spec-Bench's
speed-up per group and overall against both baselines (HF plain; splitspec off), #MAT, the
first-position acceptance, tokens/s, whether every greedy answer equals off's (a mismatch is
listed), and Spec-Bench's published Vicuna-7B rows beside them. --seeded adds a check that
seeded T 0.8 answers are identical on and off for two groups (untimed; each answer up to
--seeded-max-new-tokens, by default --max-new-tokens).

A long run keeps what it finished (bench/specbench_results.py): each unit (Hugging Face's
baseline, each configuration) is written to the results file (--results; by default the
report's path with .results.json) when it finishes, and the report is rendered again from that
file, marked partial until the last unit. --resume runs only the units the file lacks, when its
settings (questions, answer lengths, the seeded check, model, threads) are this run's; it
refuses otherwise, saying what differs. Each unit records the commit it ran at.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import specbench_cost as cost  # noqa: E402
from bench_common import bench_parser  # noqa: E402
from specbench_configs import (  # noqa: E402
    CONFIGS,
    DEFAULT,
    REPEAT_DEFAULT,
    Config,
    parse_extra,
    select,
)
from specbench_data import GROUPS, QUESTIONS, ChatPrompts, Question, load, pick  # noqa: E402
from specbench_report import HF, write_report  # noqa: E402
from specbench_results import (  # noqa: E402
    HF_DEFINITION,
    HF_KEY,
    Results,
    ResumeRefused,
    Unit,
    definition_of,
    gather,
    settings_of,
)
from specbench_speed import Answer, Turn  # noqa: E402

from splitspec.launcher import Stack, StackConfig, sibling_proposer_models  # noqa: E402
from splitspec.methods import METHODS  # noqa: E402

SEEDED_DEFAULT = ("mt_bench", "summarization")
SEEDED_TEMPERATURE = 0.8
WARMUP = "Name one river."  # nothing in it to copy: warms a stack without teaching it answers
GRPC_MODES = {"on": "SPECULATION_MODE_ON", "off": "SPECULATION_MODE_OFF",
              "auto": "SPECULATION_MODE_AUTO"}

Generate = Callable[[list[int]], Turn]


def answer(question: Question, prompts: ChatPrompts, generate: Generate) -> Answer:
    """Every turn of a question, each prompt holding the earlier turns and their answers."""
    out, texts = Answer(question.question_id, question.group), []
    for _ in question.turns:
        turn = generate(prompts.ids(list(question.turns), texts))
        out.turns.append(turn)
        texts.append(prompts.answer_text(list(turn.ids)))
    return out


# -- Hugging Face generate ---------------------------------------------------------------------

class HfPlain:
    """Spec-Bench's baseline: `generate` on the target, greedy, batch 1, stopping at the EOS ids
    the verifier stops at; timed around the call (prefill included), as Spec-Bench times its
    forward function."""

    def __init__(self, model: str):
        from compare_bench import HfBaselines

        from verifier_service.server import eos_ids

        hf = HfBaselines(model, None)
        self.torch, self.model = hf.torch, hf.model
        self.eos = sorted(eos_ids(hf.tok, hf.model))
        self.pad = hf.tok.pad_token_id if hf.tok.pad_token_id is not None else self.eos[0]

    def generate(self, ids: list[int], max_new_tokens: int) -> Turn:
        torch = self.torch
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(torch.tensor([ids]), do_sample=False,
                                      max_new_tokens=max_new_tokens, eos_token_id=self.eos,
                                      pad_token_id=self.pad)
        seconds = time.perf_counter() - start
        new = tuple(out[0, len(ids):].tolist())
        return Turn(seconds, 0.0, new, steps=len(new))


# -- splitspec through the stack ---------------------------------------------------------------

def speculation_pb(spec: dict):
    """A configuration's speculation (JSON of SpeculationConfig, mode "on"/"off"/"auto") as the
    message, with per-step details asked."""
    from google.protobuf import json_format

    from protos import common_pb2

    body = {**spec, "mode": GRPC_MODES[spec["mode"]], "details": True}
    return json_format.ParseDict(body, common_pb2.SpeculationConfig())


class StackClient:
    """Requests to a running stack's gRPC front door, one at a time, timed from the call to the
    stream's last message."""

    def __init__(self, stack: Stack):
        import grpc

        from protos import generation_pb2_grpc

        self.channel = grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}")
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)

    def generate(self, ids: list[int], spec: dict, max_new_tokens: int,
                 seed: int | None = None) -> Turn:
        from protos import common_pb2

        sampling = (common_pb2.SamplingParams(temperature=0.0, top_p=1.0) if seed is None else
                    common_pb2.SamplingParams(temperature=SEEDED_TEMPERATURE, top_p=1.0,
                                              seed=seed))
        req = common_pb2.GenerateRequest(
            token_ids=common_pb2.TokenIds(ids=ids), speculation=speculation_pb(spec),
            sampling=sampling, stopping=common_pb2.StoppingCriteria(max_tokens=max_new_tokens))
        start = time.perf_counter()
        first, tokens, usage = None, [], None
        for chunk in self.stub.Generate(req, timeout=900):
            if chunk.token_ids:
                first = first or time.perf_counter()
                tokens += chunk.token_ids
            if chunk.HasField("usage"):
                usage = chunk.usage
        end = time.perf_counter()
        s = usage.speculation
        return Turn(end - start, (first or end) - start, tuple(tokens), int(s.steps),
                    tuple(s.step_draft_tokens), tuple(s.step_accepted_tokens), s.method,
                    s.policy_reason)

    def close(self) -> None:
        self.channel.close()


def stack_config(args, cfg: Config, models: dict[str, str]) -> StackConfig:
    threads = ["--threads", str(args.threads)] if args.threads else []
    proposer_threads = (["--threads", str(args.proposer_threads)] if args.proposer_threads
                        else [])
    return StackConfig.with_free_ports(
        model=args.model, device="cpu", models=models, methods=list(cfg.methods),
        proposer_args={m: [*proposer_threads, *cfg.args_of(m)] for m in METHODS},
        log_dir=ROOT / "bench/out/logs/specbench" / cfg.key,
        verifier_args=[*threads, "--proposer-timeout-ms", "2000",
                       # lookahead's default shape, whole: (W 3 + G 2) x (N 3 - 1) nodes
                       "--max-num-speculative-tokens", str(args.max_k)])


THREADS_FACT = "torch threads (HF in the bench process; verifier; each proposer)"


def threads_fact(args) -> str:
    """The threads each process runs: the flags where given, else the stack's defaults for this
    machine (or an OMP_NUM_THREADS set here, which every service then keeps)."""
    import os

    import torch

    from splitspec.launcher.threads import (
        DRAFTER,
        LIGHT,
        THREADS_ENV,
        VERIFIER,
        host_cores,
        plan_threads,
    )

    roles = (VERIFIER, DRAFTER, LIGHT)
    default = ({r: int(os.environ[THREADS_ENV]) for r in roles} if THREADS_ENV in os.environ
               else plan_threads(host_cores(), {r: r for r in roles}))
    proposers = (str(args.proposer_threads) if args.proposer_threads
                 else f"{default[DRAFTER]} with a model, {default[LIGHT]} without")
    return (f"{args.threads or torch.get_num_threads()}; {args.threads or default[VERIFIER]}; "
            f"{proposers}")


def missing_models(cfg: Config, models: dict[str, str]) -> list[str]:
    return [m for m in cfg.methods
            if METHODS[m].capabilities.needs_model and m not in models]


# -- the run ---------------------------------------------------------------------------------

def repeat_label(cfg: Config) -> str:
    return f"{cfg.label}, repeated questions (2nd pass, same stack)"


class Timer:
    """A unit's passes, each timed and printed as it ends."""

    def __init__(self):
        self.timing: dict[str, float] = {}
        self.started = time.perf_counter()

    def __call__(self, label: str, fn):
        t0 = time.perf_counter()
        result = fn()
        self.timing[label] = time.perf_counter() - t0
        print(f"[specbench] {label}: {self.timing[label]:.0f} s", flush=True)
        return result

    @property
    def wall_s(self) -> float:
        return time.perf_counter() - self.started


def run_hf(args, questions: list[Question], prompts: ChatPrompts) -> Unit:
    """Hugging Face's baseline: loaded, warmed, its timed pass."""
    timed = Timer()
    hf = timed("HF plain: loaded", lambda: HfPlain(args.model))
    hf.generate(prompts.ids([WARMUP], []), 16)  # first calls pay one-off costs
    answers = timed("HF plain", lambda: [
        answer(q, prompts, lambda ids: hf.generate(ids, args.max_new_tokens))
        for q in questions])
    return Unit(HF, HF_DEFINITION, {HF: answers}, timed.wall_s, timed.timing)


def run_config(args, cfg: Config, client: StackClient, questions: list[Question],
               prompts: ChatPrompts, seeded: list[Question], timed: Timer,
               stack: Stack | None = None) -> Unit:
    """One configuration on its stack: warm-up, the timed pass (its step's cost split read
    from the stack's counters around it), the repeated pass when it is --repeat's, the seeded
    answers when asked (each answer up to --seeded-max-new-tokens)."""
    def gen(ids, seed=None):
        n = args.max_new_tokens if seed is None else args.seeded_max_new_tokens
        return client.generate(ids, cfg.speculation, n, seed)

    unit = Unit(cfg.label, definition_of(cfg), {}, 0.0, timed.timing)
    for _ in range(1 if args.shared_stack else 2):  # a shared stack is warm already
        client.generate(prompts.ids([WARMUP], []), cfg.speculation, 16)
    before = cost.read(stack) if stack is not None else None
    unit.rows[cfg.label] = mine = timed(
        cfg.label, lambda: [answer(q, prompts, gen) for q in questions])
    if before is not None:
        unit.cost = cost.split(
            before, cost.read(stack), sum(a.seconds for a in mine), sum(a.tokens for a in mine),
            tuple(METHODS))
    if args.repeat == cfg.key:
        unit.repeat_label = label = repeat_label(cfg)
        unit.rows[label] = timed(label, lambda: [answer(q, prompts, gen) for q in questions])
    if seeded:
        unit.seeded = timed(f"{cfg.label}: seeded answers (a check)", lambda: {
            q.question_id: [t.ids for t in answer(
                q, prompts, lambda ids, q=q: gen(ids, seed=args.seed + q.question_id)).turns]
            for q in seeded})
    return unit


def plan(results: Results, args, runnable: list[Config]) -> tuple[bool, list[Config]]:
    """What this run must measure: Hugging Face's baseline unless --no-hf or the results file
    holds it, and each configuration the file lacks (or holds without the repeated pass this
    run asks of it). Every unit the file holds is checked here, before anything starts: one
    recorded under another definition is refused (ResumeRefused)."""
    hf_todo = args.hf and not results.holds(HF_KEY, HF_DEFINITION)
    todo = [c for c in runnable if not results.holds(
        c.key, definition_of(c), repeat_label(c) if args.repeat == c.key else None)]
    return hf_todo, todo


def run(args, facts: dict[str, str]) -> dict:
    """Every system's answers, each unit (Hugging Face's baseline, each configuration) written
    to the results file (--results) as it finishes and the report rendered again from it (marked
    partial until the last); with --resume, the units the file holds are not run again.
    Returns the report's inputs (bench/specbench_results.py's gather) and "skipped": {label:
    why}, "configs": [Config], "questions", "ran": [unit keys run by this call]."""
    import torch
    from transformers import AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    questions = pick(load(args.questions), None if args.all else args.per_group,
                     tuple(args.groups))
    prompts = ChatPrompts(AutoTokenizer.from_pretrained(args.model, local_files_only=True),
                          args.max_prompt_tokens)
    extra = [parse_extra(x) for x in args.config]
    configs = select([*args.configs, *(e.key for e in extra)], extra)
    models = sibling_proposer_models(args.model)
    seeded = [q for q in questions if q.group in args.seeded] if args.seeded else []
    skipped, runnable = {}, []
    for cfg in configs:
        if (missing := missing_models(cfg, models)):
            skipped[cfg.label] = f"no model beside the target for {', '.join(missing)}"
        else:
            runnable.append(cfg)
    results = Results.open(args.results, settings_of(args, questions), facts, args.resume)
    hf_todo, todo = plan(results, args, runnable)
    keys = [HF_KEY] * args.hf + [c.key for c in runnable]
    to_run = [HF_KEY] * hf_todo + [c.key for c in todo]
    if args.resume:
        print(f"[specbench] resuming {results.path}: done: "
              + (", ".join(k for k in keys if k not in to_run) or "nothing") + "; to run: "
              + (", ".join(to_run) or "nothing"), flush=True)
    elif results.path.exists():
        print(f"[specbench] {results.path} is replaced when this run's first unit finishes "
              "(--resume would continue it)", flush=True)
    ran: list[str] = []

    def report(final: bool = False) -> dict:
        out = gather(results, keys, args.repeat)
        out.update(skipped=skipped, configs=configs, questions=questions, ran=ran)
        write_report(Path(args.out), out, args, echo=final)
        return out

    def record(key: str, unit: Unit) -> None:
        results.record(key, unit)
        ran.append(key)
        report()

    if hf_todo:
        record(HF_KEY, run_hf(args, questions, prompts))
    shared = None
    if args.shared_stack and todo:  # one stack serving every configuration's methods, in turn
        union = Config("shared", "shared", {}, tuple(dict.fromkeys(
            m for c in todo for m in c.methods)))
        shared = Stack(stack_config(args, union, models))
        Timer()("a stack for every configuration, up", shared.start)  # printed, not reported
    try:
        for cfg in todo:
            timed = Timer()
            stack = shared or Stack(stack_config(args, cfg, models))
            if shared is None:
                timed(f"{cfg.label}: its stack, up", stack.start)
            client = StackClient(stack)
            try:
                unit = run_config(args, cfg, client, questions, prompts, seeded, timed, stack)
            finally:
                client.close()
                if shared is None:
                    stack.stop()
            unit.wall_s = timed.wall_s
            record(cfg.key, unit)
    finally:
        if shared is not None:
            shared.stop()
    return report(final=True)


def parser():
    ap = bench_parser(__doc__)
    ap.set_defaults(model=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--questions", default=str(QUESTIONS))
    ap.add_argument("--per-group", type=int, default=5, help="questions per group")
    ap.add_argument("--all", action="store_true", help="every question of the file")
    ap.add_argument("--groups", nargs="+", default=list(GROUPS), choices=list(GROUPS))
    ap.add_argument("--max-new-tokens", type=int, default=256,
                    help="per answer (Spec-Bench: 1024)")
    ap.add_argument("--max-prompt-tokens", type=int, default=None,
                    help="keep only a prompt's last N ids (a target with a short context)")
    ap.add_argument("--configs", nargs="*", default=list(DEFAULT),
                    help="configurations by key (bench/specbench_configs.py): "
                         + " ".join(c.key for c in CONFIGS))
    ap.add_argument("--config", action="append", default=[],
                    help='one more: KEY={"mode": "on", "method": ...}@METHOD,METHOD '
                         "(the request's SpeculationConfig as JSON; the methods its stack serves)")
    ap.add_argument("--repeat", default=REPEAT_DEFAULT,
                    help="the configuration whose questions run a second time on its stack "
                         "(the repeated-question row; 'none': no such row)")
    ap.add_argument("--seeded", nargs="*", default=None, choices=list(GROUPS),
                    help="check seeded T 0.8 answers identical on and off for these groups "
                         f"(no group given: {' '.join(SEEDED_DEFAULT)})")
    ap.add_argument("--seed", type=int, default=1000, help="seeded answers: seed + question id")
    ap.add_argument("--no-hf", dest="hf", action="store_false",
                    help="leave Hugging Face's baseline out")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads of the target in HF and in the verifier (0: what a "
                         "user gets: torch's default in HF, the stack's default in the "
                         "verifier, splitspec/launcher/threads.py)")
    ap.add_argument("--proposer-threads", type=int, default=0,
                    help="torch threads of each proposer (0: the stack's default)")
    ap.add_argument("--max-k", type=int, default=10,
                    help="the verifier's --max-num-speculative-tokens (every stack)")
    ap.add_argument("--shared-stack", action="store_true",
                    help="one stack for every configuration, in turn (quick, for tests: a "
                         "cross-request method then drafts the answers of those before it)")
    ap.add_argument("--smoke", action="store_true",
                    help="1 question per group, 16 tokens: proves the harness end to end")
    ap.add_argument("--seeded-max-new-tokens", type=int, default=None,
                    help="the seeded check's answer length (default: --max-new-tokens)")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/specbench.md"))
    ap.add_argument("--results", "--json", default=None,
                    help="the results file: every finished unit's measurements, written as "
                         "each finishes (default: the report's path, .results.json)")
    ap.add_argument("--resume", action="store_true",
                    help="run only what the results file lacks (its settings must be this "
                         "run's), then report everything")
    return ap


def parse_args(argv: list[str] | None = None):
    """The command line, with its defaults that depend on other flags resolved."""
    args = parser().parse_args(argv)
    if args.seeded == []:
        args.seeded = list(SEEDED_DEFAULT)
    if args.smoke:
        args.per_group, args.max_new_tokens, args.all = 1, 16, False
    if args.seeded_max_new_tokens is None:
        args.seeded_max_new_tokens = args.max_new_tokens
    if args.results is None:
        args.results = str(Path(args.out).with_suffix(".results.json"))
    return args


def main(argv: list[str] | None = None) -> dict:
    from compare_bench import machine_facts

    args = parse_args(argv)
    facts = machine_facts(args.threads, args.proposer_threads)
    facts[THREADS_FACT] = threads_fact(args)
    try:
        return run(args, facts)
    except ResumeRefused as exc:
        raise SystemExit(f"[specbench] {exc}") from None


if __name__ == "__main__":
    main()
