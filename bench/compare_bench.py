"""The comparison benchmark (`make bench`): splitspec through the full stack against what users
would reach for instead, in one run, on the same held-out prompts.

    python bench/compare_bench.py [--quick] [--prompts 10] [--max-tokens 64]
                                  [--k ngram=7 draft=5 mlp=7 suffix=7] [--temperatures 0 0.8]
                                  [--model DIR] [--prompt-set code|chat]

    # the real chat model: held-out chat and code prompts through its chat template, k 2 and 3
    python bench/compare_bench.py --model models/smollm2-135m-instruct --prompt-set chat \
        --k ngram=2,3 suffix=2,3 draft=2,3 mlp=2,3 eagle=2,3 --out bench/reports/bench-real.md

Configurations, interleaved per prompt so that noise from a shared machine hits all alike:
  * in this process, Hugging Face transformers `generate` on the target: plain, with
    assistant_model = the draft (its default schedule), with prompt_lookup_num_tokens = 10;
  * through gateway -> verifier -> proposers (gRPC on 127.0.0.1, one request at a time):
    speculation off, `auto` (the gateway's policy) and every served method at each of its k
    (a method given several k is represented by its best in the goals); methods that can draft ahead
    (Capabilities.drafts_ahead) with drafting ahead pinned on and, on a second stack, pinned
    off (`--draft-ahead on|off`; the verifier's default `auto` picks the cheaper at run time).
Each at every temperature (0: greedy; > 0: sampled, top-k/top-p off).

Per configuration: tokens/s, time to first token, inter-token latency p50/p90/p99 (a chunk of n
tokens arrives at once: n - 1 gaps of 0), acceptance per draft position, mean tokens per step,
the theoretical speedup from measured acceptance and cost ratio (bench/speedup_model.py) and
achieved / theoretical, the time split of a step (bench/stack_probe.py), and the drafting-ahead
hit rate; then the verifier's forward in this process by matmul backend with its top operators
(bench/forward_profile.py), and, where llama-bench is built (bench/llama_cpp.py), llama.cpp's
plain decode on the same weights beside splitspec's decode speed. Writes bench/reports/bench.md
and PNG plots next to it (bench/bench_report.py).

Cross-request methods (one index over every request served: suffix) would learn each prompt's
answer from the configurations run on it before; their proposer is restarted before each of
their runs and each `auto` run, so no configuration sees a prompt twice.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import llama_cpp  # noqa: E402
from bench_common import bench_parser  # noqa: E402
from bench_report import write_report  # noqa: E402
from chat_prompts import chat_prompts  # noqa: E402
from forward_profile import profile_section  # noqa: E402
from spec_bench import held_out_prompts  # noqa: E402
from stack_probe import StackProbe  # noqa: E402

from splitspec.launcher import Stack, StackConfig, sibling_proposer_models  # noqa: E402
from splitspec.methods import METHODS, Kind  # noqa: E402

# text a cross-request method drafts for from the request's own repetitions (an empty index)
RECONNECT_PROMPT = "Name one river."  # no repeated text: nothing a cross-request method drafts
DEFAULT_K = {"ngram": 7, "draft": 5, "mlp": 7, "suffix": 7, "lookahead": 8, "eagle": 6}


@dataclass
class Run:
    """One request of one configuration."""

    elapsed: float
    ttft: float
    gaps: list[float]  # inter-token latencies, one per token after the first
    tokens: list[int]
    usage: object = None  # splitspec: Usage (with per-step counts)
    probe: dict = field(default_factory=dict)  # splitspec: metric deltas (stack_probe)


@dataclass(frozen=True)
class Config:
    system: str  # "hf" | "splitspec"
    name: str  # hf: plain | assisted | prompt_lookup; splitspec: off | method
    temperature: float
    k: int = 0
    ahead: bool | None = None  # drafting ahead on/off; None: not applicable
    branches: int = 1  # token trees: children per node at most (1: a chain)
    lookahead: tuple[int, int, int] | None = None  # lookahead's (W, N, G); None: the default
    seed: int | None = None  # a seeded sampled request (None: unseeded)

    @property
    def label(self) -> str:
        if self.system == "hf":
            return f"HF {self.name.replace('_', ' ')}"
        if self.name in ("off", "auto"):
            return f"splitspec {self.name}"
        ov = "" if self.ahead is None else f", ahead {'on' if self.ahead else 'off'}"
        tree = f" tree b={self.branches}" if self.branches > 1 else ""
        shape = ("" if self.lookahead is None
                 else " W{} N{} G{}".format(*self.lookahead))
        return f"splitspec {self.name} k={self.k}{tree}{shape}{ov}"


# -- Hugging Face baselines ------------------------------------------------------------------

class _Clock:
    """A transformers streamer that timestamps every chunk of new tokens."""

    def __init__(self):
        self.start = time.perf_counter()
        self.prompt_seen = False
        self.chunks: list[tuple[float, int]] = []

    def put(self, value):
        if not self.prompt_seen:  # generate() first puts the prompt
            self.prompt_seen = True
            return
        self.chunks.append((time.perf_counter(), int(value.numel())))

    def end(self):
        pass


class HfBaselines:
    def __init__(self, target: str, draft: str | None, device: str = "cpu",
                 dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = device
        dt = getattr(torch, dtype)
        self.tok = AutoTokenizer.from_pretrained(target)
        self.model = AutoModelForCausalLM.from_pretrained(target, dtype=dt).to(device).eval()
        self.draft = (AutoModelForCausalLM.from_pretrained(draft, dtype=dt).to(device).eval()
                      if draft else None)

    def run(self, cfg: Config, prompt: str, max_tokens: int) -> Run:
        ids = self.tok(prompt, return_tensors="pt",
                       add_special_tokens=False).input_ids.to(self.device)
        kw = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                  pad_token_id=self.tok.pad_token_id or 0)
        if cfg.temperature > 0:
            kw.update(do_sample=True, temperature=cfg.temperature, top_k=0, top_p=1.0)
        else:
            kw.update(do_sample=False)
        if cfg.name == "assisted":
            kw["assistant_model"] = self.draft
        elif cfg.name == "prompt_lookup":
            kw["prompt_lookup_num_tokens"] = 10
        clock = _Clock()
        with self.torch.inference_mode():
            out = self.model.generate(ids, streamer=clock, **kw)
        end = time.perf_counter()
        return _timed(clock.start, end, clock.chunks, out[0, ids.shape[1]:].tolist())


def _timed(start: float, end: float, chunks: list[tuple[float, int]], tokens: list[int],
           **extra) -> Run:
    gaps, last = [], None
    for t, n in chunks:
        if last is not None:
            gaps.append(t - last)
        gaps.extend([0.0] * max(n - 1, 0))
        last = t
    ttft = chunks[0][0] - start if chunks else end - start
    return Run(end - start, ttft, gaps, tokens, **extra)


# -- splitspec through the stack ---------------------------------------------------------------

class SplitspecClient:
    def __init__(self, stack: Stack):
        import grpc

        from protos import generation_pb2_grpc

        self.stack = stack
        self.channel = grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}")
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)
        self.probe = StackProbe(stack)

    def run(self, cfg: Config, prompt: str, max_tokens: int) -> Run:
        from protos import common_pb2

        if cfg.name == "off":
            spec = common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_OFF)
        elif cfg.name == "auto":
            spec = common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_AUTO,
                                                details=True)
        else:
            spec = common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_ON,
                                                method=cfg.name, num_speculative_tokens=cfg.k,
                                                details=True)
            if cfg.branches > 1:
                spec.num_branches = cfg.branches
            if cfg.lookahead is not None:
                w, n, g = cfg.lookahead
                spec.lookahead.CopyFrom(common_pb2.LookaheadConfig(window=w, ngram=n,
                                                                  guesses=g))
        req = common_pb2.GenerateRequest(
            text=prompt, speculation=spec,
            sampling=common_pb2.SamplingParams(temperature=cfg.temperature, top_p=1.0,
                                               seed=cfg.seed),
            stopping=common_pb2.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True))
        before = self.probe.sample()
        start = time.perf_counter()
        chunks, tokens, usage = [], [], None
        for chunk in self.stub.Generate(req, timeout=600):
            if chunk.token_ids:
                chunks.append((time.perf_counter(), len(chunk.token_ids)))
                tokens += chunk.token_ids
            if chunk.HasField("usage"):
                usage = chunk.usage
        end = time.perf_counter()
        probe = self.probe.delta(before, self.probe.sample(), cfg.name)
        return _timed(start, end, chunks, tokens, usage=usage, probe=probe)

    def forget_other_runs(self, cfg: Config) -> None:
        """Before a run that may use a cross-request method (one index over every request it
        served, e.g. suffix; `auto` may pick one): restart that proposer, so it has never seen
        this prompt or its answer from another configuration's run (each prompt runs once per
        configuration). A two-token request asking it for one token then runs until the
        verifier no longer reports it unreachable (usage.speculation.reason): it has reconnected.
        The probe's text has nothing to draft from, so it adds no accepted or tried positions to
        the acceptance `auto` learns (a repetitive probe, drafted at ~100 %, made auto pick
        suffix decoding for the held-out prompts it then ran)."""
        cross = [m for m, svc in self.stack.proposers.items()
                 if METHODS[m].capabilities.cross_request and cfg.name in (m, "auto")]
        for m in cross:
            self.stack.restart(self.stack.proposers[m])
            for _ in range(40):
                r = self.run(Config("splitspec", m, 0.0, 1), RECONNECT_PROMPT, 2)
                if r.usage is not None and not r.usage.speculation.reason:
                    break
                time.sleep(0.25)

    def close(self) -> None:
        self.channel.close()


def machine_facts(threads: int, proposer_threads: int) -> dict[str, str]:
    import platform

    import torch
    import transformers

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    commit = os.popen(f"git -C {ROOT} rev-parse --short HEAD 2>/dev/null").read().strip()
    return {"date (UTC)": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "host": platform.node(), "cpu": cpu, "cores": str(os.cpu_count()),
            "load average (1/5/15 min) at start": load,
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__,
            "torch threads (HF in the bench process; verifier; each proposer)":
                f"{torch.get_num_threads()}; {threads or 'torch default'}; {proposer_threads}",
            "commit": commit or "unknown"}


def parse_k(items: list[str]) -> dict[str, list[int]]:
    """METHOD=K or METHOD=K1,K2 items over the defaults."""
    out = {m: [k] for m, k in DEFAULT_K.items()}
    for item in items:
        m, _, ks = item.partition("=")
        out[m] = [int(k) for k in ks.split(",")]
    return out


def bench_prompts(prompt_set: str, model: str, n: int) -> list[str]:
    """code: windows of held-out stdlib source (the toy family's split); chat: held-out chat and
    code requests through the model's chat template (bench/chat_prompts.py)."""
    if prompt_set == "code":
        return held_out_prompts(n)
    from transformers import AutoTokenizer

    return chat_prompts(AutoTokenizer.from_pretrained(model, local_files_only=True), n)


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", nargs="*", default=[], help="METHOD=K or METHOD=K1,K2 (default: %s)"
                    % " ".join(f"{m}={k}" for m, k in DEFAULT_K.items()))
    ap.add_argument("--branches", nargs="*", default=[],
                    help="METHOD=B or METHOD=B@K: also measure the method's token trees with up "
                         "to B children per node, of K nodes (default: its largest k)")
    ap.add_argument("--prompt-set", choices=["code", "chat"], default=None,
                    help="code: held-out stdlib source windows; chat: held-out chat and code "
                         "requests through the model's chat template (default: chat when the "
                         "model has a chat template, else code)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.8])
    ap.add_argument("--methods", nargs="*", default=None,
                    help="splitspec methods to run (default: every one the stack serves)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the target, the same for the HF baselines and the "
                         "verifier (0: torch default). Default 1: on a small machine two "
                         "multi-threaded processes oversubscribe the cores (measured: verifier "
                         "steps ~10x slower with torch's default on 2 busy cores)")
    ap.add_argument("--proposer-threads", type=int, default=1,
                    help="torch threads of each proposer process (default 1: the drafts are "
                         "tiny, more threads only take cores from the verifier)")
    ap.add_argument("--llama-cpp", choices=["auto", "on", "off"], default="auto",
                    help="llama.cpp's plain decode on the same weights beside splitspec's "
                         "(bench/llama_cpp.py; auto: when llama-bench is built)")
    ap.add_argument("--quick", action="store_true",
                    help="3 prompts, 32 tokens: a few minutes, for a smoke run")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/bench.md"))
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.max_tokens = min(args.prompts, 3), min(args.max_tokens, 32)
    import torch
    from tqdm import tqdm

    if args.threads:
        torch.set_num_threads(args.threads)
    facts = machine_facts(args.threads, args.proposer_threads)
    if args.prompt_set is None:
        args.prompt_set = "chat" if (Path(args.model) / "chat_template.jinja").exists() else "code"
    prompts = bench_prompts(args.prompt_set, args.model, args.prompts)
    models = sibling_proposer_models(args.model)
    ks = parse_k(args.k)
    branches = {}  # method -> (children per node, nodes or None: its largest k)
    for m, _, tree in (x.partition("=") for x in args.branches):
        b, _, k = tree.partition("@")
        branches[m] = (int(b), int(k) if k else None)
    threads = ["--threads", str(args.threads)] if args.threads else []
    logs = ROOT / "bench/out/logs"

    def stack_config(ahead_on: bool, methods):
        return StackConfig.with_free_ports(
            model=args.model, device="cpu", models=models,
            methods=methods,  # in-target ones start no process: every verifier serves them
            proposer_args={m: ["--threads", str(args.proposer_threads)] for m in METHODS},
            log_dir=logs / (
                "ahead-on" if ahead_on else "ahead-off"),
            verifier_args=["--proposer-timeout-ms", "2000", *threads,
                           "--draft-ahead", "on" if ahead_on else "off"])

    ahead = [m for m, s in METHODS.items() if s.capabilities.drafts_ahead
             and (not s.capabilities.needs_model or m in models)]
    hf = HfBaselines(args.model, models.get("draft"))
    with Stack(stack_config(True, args.methods)) as on_stack, \
            Stack(stack_config(False, [m for m in ahead if args.methods is None
                                       or m in args.methods] or ["ngram"])) as off_stack:
        clients = {True: SplitspecClient(on_stack), False: SplitspecClient(off_stack)}
        served = [m for m, spec in METHODS.items()
                  if (m in on_stack.proposers or spec.kind is Kind.IN_TARGET)
                  and (args.methods is None or m in args.methods)]
        configs = []
        for t in args.temperatures:
            configs += [Config("hf", "plain", t)]
            if hf.draft is not None:
                configs += [Config("hf", "assisted", t)]
            configs += [Config("hf", "prompt_lookup", t), Config("splitspec", "off", t),
                        Config("splitspec", "auto", t)]
            for m in served:
                for k in ks.get(m, [4]):
                    if m in ahead:
                        configs += [Config("splitspec", m, t, k, True),
                                    Config("splitspec", m, t, k, False)]
                    else:
                        configs.append(Config("splitspec", m, t, k))
                if m in branches:  # a tree (drafting ahead: auto)
                    b, nodes = branches[m]
                    configs.append(Config("splitspec", m, t, nodes or max(ks.get(m, [4])),
                                          True if m in ahead else None, b))
        for cfg in configs:  # warm-up: first calls pay one-off costs
            runner = hf if cfg.system == "hf" else clients[cfg.ahead is not False]
            runner.run(cfg, prompts[0], 8)
        results: dict[Config, list[Run]] = {c: [] for c in configs}
        with tqdm(total=len(prompts) * len(configs), desc="bench", unit="run") as bar:
            for prompt in prompts:
                for cfg in configs:
                    runner = hf if cfg.system == "hf" else clients[cfg.ahead is not False]
                    if cfg.system == "splitspec":
                        runner.forget_other_runs(cfg)
                    results[cfg].append(runner.run(cfg, prompt, args.max_tokens))
                    bar.update()
        for c in clients.values():
            c.close()
    # the verifier's forward by matmul backend and its top operators, after the stacks are
    # down (in this process, nothing else running)
    try:  # the runs above are the report: a profile that fails costs only its section
        profile = profile_section(args.model, k=max(ks.get("draft", [5])))
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        profile = ["## Verifier forward profile (in process)", "",
                   f"Not measured: the profile failed ({type(exc).__name__}: {exc}).", ""]
    if args.llama_cpp != "off" and (args.llama_cpp == "on" or llama_cpp.bench_binary()):
        profile += llama_cpp_lines(args, prompts, results)
    write_report(Path(args.out), results, facts, args, ks, profile)


def decode_tok_s(runs: list[Run]) -> float:
    """Tokens after the first over the time after the first (the prefill left out)."""
    return (sum(len(r.tokens) - 1 for r in runs)
            / max(sum(r.elapsed - r.ttft for r in runs), 1e-9))


def llama_cpp_lines(args, prompts: list[str], results: dict) -> list[str]:
    """llama.cpp's plain decode at the prompts' mean depth beside splitspec's at temperature 0:
    off, the fastest fixed method and auto."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    depth = round(sum(len(tok.encode(p, add_special_tokens=False)) for p in prompts)
                  / len(prompts))
    greedy = {c: (decode_tok_s(r), verifier_ms_per_token(r)) for c, r in results.items()
              if c.system == "splitspec" and c.temperature == 0 and r}
    fixed = {c: v for c, v in greedy.items() if c.name not in ("off", "auto")}
    ours = {c.label: v for c, v in greedy.items() if c.name in ("off", "auto")}
    if fixed:
        best = max(fixed, key=lambda c: fixed[c][0])
        ours[f"{best.label} (fastest fixed)"] = fixed[best]
    return llama_cpp.section(args.model, depth, args.max_tokens, ours)


def verifier_ms_per_token(runs: list[Run]) -> float | None:
    """The verifier's own step time per token after the first (its steps' seconds from the stack
    probe less the time to the first token, which holds the prefill step, over the tokens
    after the first): the engine without the gateway and the client."""
    steps = sum(r.probe.get("step_s", 0.0) for r in runs)
    if not steps:
        return None
    return (1000 * (steps - sum(r.ttft for r in runs))
            / max(sum(len(r.tokens) - 1 for r in runs), 1))


if __name__ == "__main__":
    main()
