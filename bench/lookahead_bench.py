"""Lookahead decoding against speculation off, n-gram and suffix, through the full stack:
compression (tokens per step, the paper's metric), tokens/s, rows fed per step and what an extra
row costs, at batch 1 and 4, greedy, on held-out code, repetitive text and chat prompts; and
`auto` (the gateway's policy), which has lookahead among its candidates.

    python bench/lookahead_bench.py [--model DIR] [--prompts 4] [--max-tokens 48]
        [--shapes 3,3,2 5,4,3 ...] [--out bench/reports/lookahead.md]

Every configuration runs every prompt once (a cross-request method never sees a prompt twice):
batch 1 one request at a time, batch 4 as many other prompts of the same kind, four concurrent
requests at a time. Lookahead
runs at k = its shape's W x (N - 1) + G x (N - 1) nodes (the verifier is started with a node
limit that holds the largest), and once without k at the verifier's default shape (the k the
gateway plans, adapted per step). Rows per step = 1 + proposed nodes / steps; the cost of a row is
(ms per step - off's ms per step) / (rows per step - 1), from batch 1. Greedy outputs are
checked against speculation off's (the "same" column).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import httpx  # noqa: E402
from bench_common import bench_parser, write_markdown  # noqa: E402
from chat_prompts import chat_prompts  # noqa: E402
from spec_bench import held_out_prompts  # noqa: E402

from splitspec.launcher import Stack, StackConfig  # noqa: E402

# Text whose continuation repeats what it has already said: where n-gram pools pay most.
REPETITIVE = [
    "id,name,city\n1,alice,paris\n2,bob,berlin\n3,carol,paris\n4,dave,berlin\n5,erin,paris\n",
    "def get_a(self):\n    return self.a\n\ndef get_b(self):\n    return self.b\n\n"
    "def get_c(self):\n    return self.c\n\ndef get_d(self):\n",
    "- step 1: open the file\n- step 2: read the file\n- step 3: close the file\n"
    "- step 4: open the file\n- step 5: read the file\n",
    '{"key": "a", "value": 1}\n{"key": "b", "value": 2}\n{"key": "c", "value": 3}\n',
    "monday: 9:00 standup, 12:00 lunch\ntuesday: 9:00 standup, 12:00 lunch\n"
    "wednesday: 9:00 standup, 12:00 lunch\nthursday:",
    "x = [0] * 8\nx[0] = 1\nx[1] = 2\nx[2] = 3\nx[3] = 4\nx[4] = 5\n",
    "<tr><td>apple</td><td>3</td></tr>\n<tr><td>pear</td><td>5</td></tr>\n"
    "<tr><td>plum</td><td>7</td></tr>\n",
    "assert add(1, 2) == 3\nassert add(2, 3) == 5\nassert add(3, 4) == 7\nassert add(",
]


@dataclass(frozen=True)
class Shape:
    window: int
    ngram: int
    guesses: int

    @property
    def k(self) -> int:
        return (self.window + self.guesses) * (self.ngram - 1)

    def __str__(self) -> str:
        return f"W{self.window} N{self.ngram} G{self.guesses}"


def configs(shapes: list[Shape], k: int) -> list[tuple[str, dict]]:
    out = [("off", {"mode": "off"}),
           ("auto", {"mode": "auto"}),  # the gateway's policy, lookahead among its candidates
           (f"ngram k={k}", {"mode": "on", "method": "ngram", "num_speculative_tokens": k}),
           (f"suffix k={k}", {"mode": "on", "method": "suffix", "num_speculative_tokens": k}),
           # as a user asks it: the verifier's default shape at the k the gateway plans
           ("lookahead, k unset", {"mode": "on", "method": "lookahead"})]
    for s in shapes:
        out.append((f"lookahead {s} (k={s.k})", {
            "mode": "on", "method": "lookahead", "num_speculative_tokens": s.k,
            "lookahead": {"window": s.window, "ngram": s.ngram, "guesses": s.guesses}}))
    return out


def complete(client: httpx.Client, prompt: str, spec: dict, max_tokens: int) -> dict:
    r = client.post("/v1/completions", json={
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "speculation": spec})
    r.raise_for_status()
    return r.json()


def run(client: httpx.Client, prompts: list[str], spec: dict, max_tokens: int,
        batch: int) -> tuple[float, list[dict]]:
    """Wall seconds and the responses: one at a time (batch 1) or `batch` concurrent."""
    start = time.perf_counter()
    if batch == 1:
        out = [complete(client, p, spec, max_tokens) for p in prompts]
    else:
        with ThreadPoolExecutor(batch) as pool:
            out = list(pool.map(lambda p: complete(client, p, spec, max_tokens), prompts))
    return time.perf_counter() - start, out


def rows(name: str, results: dict[str, tuple[float, list[dict]]], batch: int) -> list[str]:
    off_s, off = results["off"]
    off_tokens = sum(r["usage"]["completion_tokens"] for r in off)
    off_ms_step = off_s * 1000 / sum(r["usage"]["speculation"]["steps"] for r in off)
    lines = []
    for label, (seconds, resp) in results.items():
        tokens = sum(r["usage"]["completion_tokens"] for r in resp)
        steps = sum(r["usage"]["speculation"]["steps"] for r in resp)
        proposed = sum(r["usage"]["speculation"]["proposed_tokens"] for r in resp)
        accepted = sum(r["usage"]["speculation"]["accepted_tokens"] for r in resp)
        same = all(r["choices"][0]["text"] == o["choices"][0]["text"] for r, o in zip(resp, off))
        tok_s, off_tok_s = tokens / seconds, off_tokens / off_s
        row_count = 1 + proposed / steps
        ms_step = seconds * 1000 / steps
        per_row = ((ms_step - off_ms_step) / (row_count - 1)
                   if batch == 1 and row_count > 1 else None)
        if label == "auto":  # what the policy chose for these requests
            chose = Counter(r["usage"]["speculation"]["method"] or "off" for r in resp)
            label += " (" + ", ".join(f"{m} x{n}" for m, n in chose.most_common()) + ")"
        lines.append(
            f"| {name} | {batch} | {label} | {tok_s:.1f} | {tok_s / off_tok_s:.2f}x | "
            f"{tokens / steps:.2f} | {row_count:.1f} | "
            f"{(accepted / proposed if proposed else 0):.2f} | {ms_step:.1f} | "
            f"{'-' if per_row is None else f'{per_row:.2f}'} | {'yes' if same else 'NO'} |")
    return lines


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--models", nargs="*", default=None,
                    help="targets to run (default: --model, and the real chat model if imported)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=5, help="n-gram and suffix draft length")
    ap.add_argument("--shapes", nargs="*", default=["3,3,2", "5,4,3"],
                    help="lookahead (W,N,G) shapes")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/lookahead.md"))
    args = ap.parse_args()
    shapes = [Shape(*map(int, s.split(","))) for s in args.shapes]
    real = ROOT / "models/smollm2-135m-instruct"
    models = args.models or [args.model, *([str(real)] if (real / "config.json").exists() else [])]
    lines = ["# Lookahead decoding vs off, n-gram and suffix", "",
             f"Produced by `python bench/lookahead_bench.py` ({time.strftime('%Y-%m-%d %H:%M')} "
             f"UTC); {args.prompts} prompts x {args.max_tokens} tokens (EOS ignored), greedy; "
             "each process one thread. Columns: tokens per step is the compression; rows per "
             "step = 1 + nodes verified per step; acceptance = accepted / nodes; ms per row = "
             "the extra step time per extra row against off (batch 1).", "",
             "| model / prompts | batch | configuration | tok/s | vs off | tokens / step | "
             "rows / step | acceptance | ms / step | ms per extra row | same as off |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for model in models:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
        n = args.prompts
        sets = {"code": held_out_prompts(2 * n), "repetitive": REPETITIVE[:2 * n]}
        if tok.chat_template:
            sets["chat"] = chat_prompts(tok, 2 * n)
        config = StackConfig.with_free_ports(
            model=model, device="cpu", methods=["ngram", "suffix"],
            log_dir=ROOT / "bench/out/logs/lookahead",
            verifier_args=["--threads", "1", "--max-num-speculative-tokens",
                           str(max([args.k, *(s.k for s in shapes)]))])
        with Stack(config) as stack, httpx.Client(base_url=stack.url, timeout=600) as client:
            complete(client, "warm up", {"mode": "off"}, 8)
            for set_name, prompts in sets.items():
                for batch, some in ((1, prompts[:n]), (4, prompts[n:2 * n])):
                    results = {label: run(client, some, spec, args.max_tokens, batch)
                               for label, spec in configs(shapes, args.k)}
                    lines += rows(f"{Path(model).name} / {set_name}", results, batch)
                    print("\n".join(lines[-len(results):]), flush=True)
    write_markdown(args.out, lines)


if __name__ == "__main__":
    main()
