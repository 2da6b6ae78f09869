"""Repetitive traffic through the real services: the same task family sent again and again, as
agent loops and templated jobs do. Compares speculation off, prompt lookup (n-gram) and the
cross-request suffix proposer, which also drafts from what earlier requests produced.

    python bench/repeat_bench.py [--tasks 6] [--rounds 4] [--max-tokens 64] [--k 5]

Each task is a held-out code snippet followed by a varying last line (the "input" of that round);
rounds send every task once more, in the same order, configurations interleaved per request so
that noise from the shared machine hits them alike. Greedy decoding: every output must equal the
speculation-off output. Reported per configuration and round: ms per output token, accepted tokens
per verifier step, speedup vs off. Writes bench/reports/repeat.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from spec_bench import held_out_prompts  # noqa: E402

from splitspec.config import DEFAULT_MODEL  # noqa: E402
from splitspec.launcher import Stack, StackConfig  # noqa: E402

INPUTS = ["x = load(path)", "items = sorted(items)", "total = 0", "result = None",
          "count += 1", "name = name.strip()"]


def task_prompt(snippet: str, round_no: int) -> str:
    return f"{snippet}\n# round {round_no}\n{INPUTS[round_no % len(INPUTS)]}\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / DEFAULT_MODEL))
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench/reports/repeat.md"))
    args = ap.parse_args()
    snippets = held_out_prompts(args.tasks, chars=300)
    config = StackConfig.with_free_ports(model=args.model, device="cpu",
                                         methods=["ngram", "suffix"],
                                         log_dir=ROOT / "bench/out/logs",
                                         verifier_args=["--proposer-timeout-ms", "2000"])
    configs = [("off", 0), ("ngram", args.k), ("suffix", args.k)]
    rows: dict[tuple[str, int], list[tuple[float, str, dict]]] = {}
    with Stack(config) as stack, httpx.Client(base_url=stack.url, timeout=300) as client:
        for r in range(args.rounds):
            for snippet in snippets:
                prompt = task_prompt(snippet, r)
                for method, k in configs:
                    spec = ({"mode": "off"} if method == "off" else
                            {"mode": "on", "method": method, "num_speculative_tokens": k})
                    t0 = time.perf_counter()
                    resp = client.post("/v1/completions", json={
                        "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0,
                        "ignore_eos": True, "speculation": spec})
                    elapsed = time.perf_counter() - t0
                    resp.raise_for_status()
                    body = resp.json()
                    rows.setdefault((method, r), []).append(
                        (elapsed, body["choices"][0]["text"], body["usage"]))
    lines = [
        "# Repetitive traffic: n-gram vs the cross-request suffix proposer", "",
        f"Target `{Path(args.model).name}`; {args.tasks} tasks x {args.rounds} rounds, "
        f"{args.max_tokens} greedy tokens each, k = {args.k}, one request at a time through "
        f"gateway -> verifier -> proposer on 127.0.0.1 ({platform.machine()} CPU, "
        f"{platform.python_version()}). Configurations interleaved per request; ratios are "
        "within this run. Produced by `python bench/repeat_bench.py`.", "",
        "| method | round | ms / token | speedup vs off | accepted / step | tokens / step | "
        "identical to off |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]

    def ms_per_token(entries) -> float:
        return statistics.mean(e / u["completion_tokens"] for e, _, u in entries) * 1000

    totals: dict[str, list] = {}
    for r in range(args.rounds):
        off = rows[("off", r)]
        for method, _ in configs:
            entries = rows[(method, r)]
            totals.setdefault(method, []).extend(entries)
            steps = sum(u["speculation"]["steps"] for _, _, u in entries)
            acc = sum(u["speculation"]["accepted_tokens"] for _, _, u in entries)
            toks = sum(u["completion_tokens"] for _, _, u in entries)
            same = all(t == o[1] for (_, t, _), o in zip(entries, off))
            lines.append(f"| {method} | {r + 1} | {ms_per_token(entries):.2f} | "
                         f"{ms_per_token(off) / ms_per_token(entries):.2f}x | {acc / steps:.2f} | "
                         f"{toks / steps:.2f} | {'yes' if same else 'NO'} |")
    lines += ["", "| method | all rounds: ms / token | speedup vs off | accepted / step |",
              "|---|---:|---:|---:|"]
    for method, entries in totals.items():
        steps = sum(u["speculation"]["steps"] for _, _, u in entries)
        acc = sum(u["speculation"]["accepted_tokens"] for _, _, u in entries)
        lines.append(f"| {method} | {ms_per_token(entries):.2f} | "
                     f"{ms_per_token(totals['off']) / ms_per_token(entries):.2f}x | "
                     f"{acc / steps:.2f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
