"""Prefix caching on the real model: each scenario with caching on and off in one run, every
configuration in a fresh stack (its own processes, an empty cache), requests through the
gateway's gRPC API, greedy.

    system prompt   a ~1,500-token system prompt before short questions, batch 1: time to
                    first token and decode tok/s (the first question, which fills the cache,
                    reported apart)
    multi-turn      chat conversations of three turns about a document (~800 tokens), each
                    turn re-sending the history with the model's own answers: time per
                    conversation
    distinct        raw-text prompts that share no block (0 % hits): throughput
    concurrent      16 clients sharing the system prompt, two questions each: throughput
    replicas        two verifier replicas, conversations interleaved: hit rate and TTFT p50
                    with the gateway's prefix routing against least-requests routing
    eagle           the system-prompt questions with EAGLE (k 3): acceptance on vs off

Writes bench/reports/prefix.md (--out). `make bench-prefix`; --quick for a smoke run.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_common import ROOT, bench_parser, markdown_table, write_markdown  # noqa: E402
from compare_bench import machine_facts  # noqa: E402
from stack_probe import StackProbe  # noqa: E402

from splitspec.launcher.config import StackConfig, sibling_proposer_models  # noqa: E402
from splitspec.launcher.stack import Stack  # noqa: E402

QUESTIONS = [
    "In one sentence, what does the verifier own?",
    "What happens when a proposer is late?",
    "Name two things the gateway does.",
    "What is a draft tree?",
    "Why is a seeded request reproducible?",
    "What does the KV cache keep after a step?",
    "What is lookahead decoding?",
    "What does the goodput policy decide?",
    "How are tokens streamed to the client?",
    "What does tensor parallelism split?",
]

# three turns each: a document to read, then two follow-ups (the document is re-sent with the
# history every turn, as chat clients do)
CONVERSATIONS = [
    ["Summarize this text in two sentences.", "What is its most important point?",
     "Write one question a reader might still have."],
    ["List three facts from this text.", "Which of them surprised you, and why?",
     "Explain the first fact to a child."],
    ["What is this text about?", "Who would need to read it?",
     "Give it a short title."],
    ["Give a one-line summary of this text.", "What does it leave out?",
     "Rewrite the summary for an expert."],
    ["Which words in this text are technical terms?", "Define the first of them.",
     "Use it in a sentence."],
]


def system_prompt(tokenizer, tokens: int) -> str:
    """About `tokens` tokens of the project's own documentation, as a product manual."""
    text = (ROOT / "docs/architecture.md").read_text()
    ids = tokenizer.encode(text, add_special_tokens=False)[:tokens]
    return ("You answer questions about the splitspec serving system, using this manual.\n\n"
            + tokenizer.decode(ids))


def distinct_prompts(tokenizer, n: int, tokens: int) -> list[str]:
    """n raw-text prompts of about `tokens` tokens, no two starting alike."""
    words = (ROOT / "docs/reliability.md").read_text().split()
    out = []
    for i in range(n):
        body = " ".join(words[(i * 37) % max(1, len(words) - 400):][:int(tokens * 0.7)])
        out.append(f"Document {i * 7919 % 1000:03d}, note {i}: {body}")
    return out


@dataclass
class Result:
    seconds: float
    ttft: float
    tokens: list[int]
    cached: int = 0
    proposed: int = 0
    accepted: int = 0


class Client:
    """Requests through a stack's gateway (gRPC), one stream each."""

    def __init__(self, stack: Stack):
        import grpc

        from protos import generation_pb2_grpc

        self.channel = grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}")
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)
        self.probe = StackProbe(stack)

    def run(self, prompt: str | list[dict], max_tokens: int, method: str | None = None,
            k: int = 3) -> Result:
        from protos import common_pb2

        if method is None:
            spec = common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_OFF)
        else:
            spec = common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_ON,
                                                method=method, num_speculative_tokens=k)
        req = common_pb2.GenerateRequest(
            speculation=spec, sampling=common_pb2.SamplingParams(temperature=0.0),
            # every answer its full length: the same work with caching on and off
            stopping=common_pb2.StoppingCriteria(max_tokens=max_tokens, ignore_eos=True))
        if isinstance(prompt, str):
            req.text = prompt
        else:
            for m in prompt:
                req.options.messages.add(role=m["role"], content=m["content"])
        start = time.perf_counter()
        first, tokens, usage = None, [], None
        for chunk in self.stub.Generate(req, timeout=900):
            if chunk.token_ids and first is None:
                first = time.perf_counter()
            tokens += chunk.token_ids
            if chunk.HasField("usage"):
                usage = chunk.usage
        end = time.perf_counter()
        return Result(end - start, (first or end) - start, tokens,
                      usage.cached_tokens if usage else 0,
                      usage.speculation.proposed_tokens if usage else 0,
                      usage.speculation.accepted_tokens if usage else 0)

    def hit_rate(self) -> tuple[float, float]:
        """(hits, queries) over every replica, in prompt tokens."""
        hits = queries = 0.0
        for name in self.probe.urls:
            if name.startswith("verifier"):
                s = self.probe.scrape(name)
                hits += s.get(("splitspec_prefix_cache_hits_total", ()), 0.0)
                queries += s.get(("splitspec_prefix_cache_queries_total", ()), 0.0)
        return hits, queries

    def close(self):
        self.channel.close()


class Bench:
    def __init__(self, args):
        from splitspec.modelio import load_tokenizer

        self.args = args
        self.tokenizer = load_tokenizer(args.model)
        self.models = sibling_proposer_models(args.model)
        self.logs = ROOT / "bench/out/prefix-logs"

    def stack(self, caching: bool, replicas: int = 1, gateway_args=(), methods=("eagle",)):
        threads = ["--threads", str(self.args.threads)] if self.args.threads else []
        return Stack(StackConfig.with_free_ports(
            model=self.args.model, device="cpu", models=self.models,
            methods=[m for m in methods if m in self.models or m == "ngram"],
            log_dir=self.logs, verifier_replicas=replicas, metrics_port=None,
            gateway_args=list(gateway_args),
            verifier_args=[*threads, "--max-model-len", "4096",
                           "--kv-cache-memory-mb", str(self.args.kv_mb),
                           *([] if caching else ["--no-enable-prefix-caching"])]))

    def chat(self, system: str | None, user: str) -> list[dict]:
        return ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}]

    # -- scenarios -------------------------------------------------------------------------

    def system_prompt(self, client: Client, system: str, method=None) -> list[Result]:
        return [client.run(self.chat(system, q), self.args.max_tokens, method)
                for q in QUESTIONS[:self.args.questions]]

    def document(self, i: int) -> str:
        """Conversation i's document: about --document-tokens tokens of the project's docs."""
        ids = self.tokenizer.encode((ROOT / "docs/reliability.md").read_text(),
                                    add_special_tokens=False)
        n = self.args.document_tokens
        start = (i * n) % max(1, len(ids) - n)
        return self.tokenizer.decode(ids[start:start + n])

    def multi_turn(self, client: Client) -> list[tuple[float, list[Result]]]:
        out = []
        for i, conv in enumerate(CONVERSATIONS[:self.args.conversations]):
            history, results, start = [], [], time.perf_counter()
            for t, turn in enumerate(conv):
                text = f"{turn}\n\n{self.document(i)}" if t == 0 else turn
                history.append({"role": "user", "content": text})
                r = client.run(list(history), self.args.turn_tokens)
                results.append(r)
                history.append({"role": "assistant", "content": self.tokenizer.decode(
                    r.tokens, skip_special_tokens=True)})
            out.append((time.perf_counter() - start, results))
        return out

    def distinct(self, client: Client) -> tuple[float, list[Result]]:
        prompts = distinct_prompts(self.tokenizer, self.args.distinct, 200)
        start = time.perf_counter()
        results = [client.run(p, self.args.max_tokens) for p in prompts]
        return time.perf_counter() - start, results

    def concurrent(self, client: Client, system: str) -> tuple[float, list[Result]]:
        results, lock = [], threading.Lock()

        def one(c: int):
            for r in range(2):
                got = client.run(self.chat(system, QUESTIONS[(c + r) % len(QUESTIONS)]
                                           + f" (client {c})"), self.args.max_tokens)
                with lock:
                    results.append(got)

        start = time.perf_counter()
        with ThreadPoolExecutor(self.args.clients) as pool:
            list(pool.map(one, range(self.args.clients)))
        return time.perf_counter() - start, results

    def replicas(self, client: Client, system_for) -> list[Result]:
        """Conversations interleaved turn by turn: each has its own long system prompt, so
        only the replica that served its earlier turns holds its prefix."""
        # an odd number: with an even one, least-requests' alternation happens to keep each
        # conversation on one replica when they are sent one at a time
        convs = CONVERSATIONS[:self.args.replica_conversations]
        histories = [[{"role": "system", "content": system_for(i)}] for i in range(len(convs))]
        results = []
        for turn in range(3):
            for i, conv in enumerate(convs):
                histories[i].append({"role": "user", "content": conv[turn]})
                r = client.run(list(histories[i]), self.args.turn_tokens)
                results.append(r)
                histories[i].append({"role": "assistant", "content": self.tokenizer.decode(
                    r.tokens, skip_special_tokens=True)})
        return results


def decode_rate(results: list[Result]) -> float:
    """Tokens after the first over the time after the first token, summed over requests."""
    return (sum(len(r.tokens) - 1 for r in results)
            / sum(r.seconds - r.ttft for r in results))


def p50(xs):
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--turn-tokens", type=int, default=48)
    ap.add_argument("--document-tokens", type=int, default=800)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--replica-conversations", type=int, default=5)
    ap.add_argument("--distinct", type=int, default=12)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    # 1 GiB (1,456 blocks of 16 tokens for this model): eight 1,550-token sequences fit with
    # caching off too, so the concurrent scenario compares compute, not preemption (at the
    # verifier's default 512 MiB, caching off preempts and recomputes: measured 19x slower)
    ap.add_argument("--kv-mb", type=int, default=1024)
    ap.add_argument("--routing-off", default="--no-prefix-routing",
                    help="the gateway flag that turns prefix routing off (least requests)")
    ap.add_argument("--skip", nargs="*", default=[], help="scenarios to leave out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/prefix.md"))
    args = ap.parse_args()
    if args.quick:
        args.questions, args.conversations, args.distinct, args.clients = 3, 2, 3, 4
        args.replica_conversations = 3
        args.max_tokens, args.turn_tokens, args.system_tokens = 8, 8, 400
        args.document_tokens = 200
    b = Bench(args)
    system = system_prompt(b.tokenizer, args.system_tokens)
    sys_tokens = len(b.tokenizer.encode(system, add_special_tokens=False))
    facts = machine_facts(args.threads, 1)
    lines = ["# Prefix caching on the real model (make bench-prefix)", "",
             f"{facts.get('cpu', '')}, {facts.get('cores', '')} cores; target "
             f"{Path(args.model).name}; greedy; verifier: {args.threads} torch thread, "
             f"{args.kv_mb} MiB of KV cache; each configuration in a fresh stack (an empty "
             f"cache); caching on vs off in one run ({facts.get('date (UTC)', '')}).", ""]
    identical: list[str] = []

    def same(name, a: list[Result], c: list[Result]):
        if [r.tokens for r in a] != [r.tokens for r in c]:
            identical.append(name)

    results = {}
    for caching in (False, True):
        with b.stack(caching) as stack:
            client = Client(stack)
            client.run("Hello", 2)  # first request pays one-off costs
            r = {}
            if "system" not in args.skip:
                r["system"] = b.system_prompt(client, system)
            if "multi-turn" not in args.skip:
                r["multi-turn"] = b.multi_turn(client)
            if "distinct" not in args.skip:
                r["distinct"] = b.distinct(client)
            if "concurrent" not in args.skip:
                r["concurrent"] = b.concurrent(client, system + "\n")
            if "eagle" not in args.skip and "eagle" in b.models:
                # a system prompt of its own: the cache holds none of it yet
                r["eagle"] = b.system_prompt(client, "Manual, second edition.\n" + system,
                                             method="eagle")
            client.close()
        results[caching] = r
        print(f"caching {'on' if caching else 'off'}: done", flush=True)

    off, on = results[False], results[True]
    goals = []
    if "system" in on:
        same("system prompt", off["system"], on["system"])
        t_off = p50([x.ttft for x in off["system"][1:]])
        t_on = p50([x.ttft for x in on["system"][1:]])
        d_off, d_on = decode_rate(off["system"][1:]), decode_rate(on["system"][1:])
        lines += [f"## Shared system prompt ({sys_tokens} tokens) before short questions, "
                  f"batch 1, {args.max_tokens} tokens", ""]
        lines += markdown_table({"caching": "l", "first question TTFT s": "r",
                                 "TTFT p50 s (the others)": "r", "decode tok/s": "r",
                                 "cached tokens (mean)": "r"}, [
            [name, f"{res[0].ttft:.3f}", f"{p50([x.ttft for x in res[1:]]):.3f}",
             f"{decode_rate(res[1:]):.1f}",
             f"{statistics.mean(x.cached for x in res[1:]):.0f}"]
            for name, res in (("off", off["system"]), ("on", on["system"]))])
        goals += [("TTFT at least 5x shorter", f"{t_off / t_on:.1f}x", t_off / t_on >= 5),
                  ("decode tok/s within 3%", f"{(d_on / d_off - 1) * 100:+.1f}%",
                   abs(d_on / d_off - 1) <= 0.03)]
    if "multi-turn" in on:
        same("multi-turn", [x for _, rs in off["multi-turn"] for x in rs],
             [x for _, rs in on["multi-turn"] for x in rs])
        c_off = statistics.mean(t for t, _ in off["multi-turn"])
        c_on = statistics.mean(t for t, _ in on["multi-turn"])
        lines += ["", f"## Multi-turn chat ({args.conversations} conversations of 3 turns about a "
                  f"{args.document_tokens}-token document, {args.turn_tokens} tokens a turn)", ""]
        lines += markdown_table({"caching": "l", "s per conversation": "r",
                                 "turn 3 TTFT p50 s": "r", "cached tokens, turn 3 (mean)": "r"}, [
            [name, f"{statistics.mean(t for t, _ in res):.2f}",
             f"{p50([rs[2].ttft for _, rs in res]):.3f}",
             f"{statistics.mean(rs[2].cached for _, rs in res):.0f}"]
            for name, res in (("off", off["multi-turn"]), ("on", on["multi-turn"]))])
        goals.append(("time per conversation at least 1.5x shorter", f"{c_off / c_on:.2f}x",
                      c_off / c_on >= 1.5))
    if "distinct" in on:
        same("distinct", off["distinct"][1], on["distinct"][1])

        def tput(run):
            return sum(len(x.tokens) for x in run[1]) / run[0]
        lines += ["", f"## Every prompt distinct (0 % hits), {args.distinct} raw-text prompts "
                  "of ~200 tokens, batch 1", ""]
        lines += markdown_table({"caching": "l", "output tok/s": "r", "cached tokens": "r"}, [
            [name, f"{tput(res):.1f}", sum(x.cached for x in res[1])]
            for name, res in (("off", off["distinct"]), ("on", on["distinct"]))])
        cost = 1 - tput(on["distinct"]) / tput(off["distinct"])
        goals.append(("0 % hits: throughput cost at most 2%", f"{cost * 100:+.1f}%",
                      cost <= 0.02))
    if "concurrent" in on:
        def tput(run):
            return sum(len(x.tokens) for x in run[1]) / run[0]
        lines += ["", f"## {args.clients} concurrent clients sharing the system prompt, "
                  f"2 questions each, {args.max_tokens} tokens", ""]
        lines += markdown_table({"caching": "l", "output tok/s": "r", "wall s": "r",
                                 "TTFT p50 s": "r"}, [
            [name, f"{tput(res):.1f}", f"{res[0]:.1f}", f"{p50([x.ttft for x in res[1]]):.2f}"]
            for name, res in (("off", off["concurrent"]), ("on", on["concurrent"]))])
        ratio = tput(on["concurrent"]) / tput(off["concurrent"])
        goals.append(("16 concurrent clients: throughput at least 1.5x", f"{ratio:.2f}x",
                      ratio >= 1.5))
    if "eagle" in on:
        same("eagle", off["eagle"], on["eagle"])

        def acc(res):
            return sum(x.accepted for x in res) / max(1, sum(x.proposed for x in res))
        lines += ["", "## EAGLE (k 3) on the system-prompt questions", ""]
        lines += markdown_table({"caching": "l", "acceptance": "r", "cached tokens (mean)": "r"},
                                [[name, f"{acc(res):.3f}",
                                  f"{statistics.mean(x.cached for x in res[1:]):.0f}"]
                                 for name, res in (("off", off["eagle"]), ("on", on["eagle"]))])
        rel = acc(on["eagle"]) / max(acc(off["eagle"]), 1e-9)
        goals.append(("EAGLE acceptance within 5% of off", f"{(rel - 1) * 100:+.1f}%",
                      abs(rel - 1) <= 0.05))
    if "replicas" not in args.skip:
        rows, ttfts, rates = [], {}, {}
        for routing, gw in (("least requests", [args.routing_off]), ("prefix", [])):
            with b.stack(True, replicas=2, gateway_args=gw, methods=()) as stack:
                client = Client(stack)
                client.run("Hello", 2)
                h0, q0 = client.hit_rate()
                res = b.replicas(client, lambda i: f"Conversation {i}.\n" + system[:2500])
                h1, q1 = client.hit_rate()
                client.close()
            rates[routing] = (h1 - h0) / max(1.0, q1 - q0)
            ttfts[routing] = p50([x.ttft for x in res])
            rows.append([routing, f"{rates[routing]:.3f}", f"{ttfts[routing]:.3f}"])
        lines += ["", f"## Two replicas, {args.replica_conversations} conversations interleaved "
                  "turn by "
                  "turn, each with its own system prompt", ""]
        lines += markdown_table({"routing": "l", "prefix-cache hit rate": "r",
                                 "TTFT p50 s": "r"}, rows)
        ratio = rates["prefix"] / max(rates["least requests"], 1e-9)
        goals += [("two replicas: hit rate with prefix routing at least 1.8x least requests'",
                   f"{ratio:.2f}x", ratio >= 1.8),
                  ("two replicas: TTFT p50 lower with prefix routing",
                   f"{ttfts['prefix']:.3f} vs {ttfts['least requests']:.3f} s",
                   ttfts["prefix"] < ttfts["least requests"])]
    lines = lines[:4] + ["## Goals", ""] + markdown_table(
        {"goal": "l", "measured": "r", "met": "l"},
        [[g, m, "yes" if ok else "**no**"] for g, m, ok in goals]) + [
        "", "Greedy output identical with caching on and off: "
        + ("yes, every request" if not identical else f"**no**: {', '.join(identical)}"),
        ""] + lines[4:]
    write_markdown(args.out, lines)


if __name__ == "__main__":
    main()
