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

import platform
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import Totals, bench_parser, identical, timed_completion, write_markdown  # noqa: E402
from spec_bench import held_out_prompts  # noqa: E402

from splitspec.launcher import Stack, StackConfig  # noqa: E402

INPUTS = ["x = load(path)", "items = sorted(items)", "total = 0", "result = None",
          "count += 1", "name = name.strip()"]


def task_prompt(snippet: str, round_no: int) -> str:
    return f"{snippet}\n# round {round_no}\n{INPUTS[round_no % len(INPUTS)]}\n"


def main() -> None:
    ap = bench_parser(__doc__)
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
                    rows.setdefault((method, r), []).append(
                        timed_completion(client, prompt, args.max_tokens, method, k))
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

    totals: dict[str, list] = {}
    for r in range(args.rounds):
        off = Totals.of(rows[("off", r)])
        for method, _ in configs:
            entries = rows[(method, r)]
            totals.setdefault(method, []).extend(entries)
            t = Totals.of(entries)
            lines.append(f"| {method} | {r + 1} | {t.ms_per_token:.2f} | "
                         f"{off.ms_per_token / t.ms_per_token:.2f}x | "
                         f"{t.accepted / t.steps:.2f} | {t.tokens / t.steps:.2f} | "
                         f"{identical(entries, rows[('off', r)])} |")
    lines += ["", "| method | all rounds: ms / token | speedup vs off | accepted / step |",
              "|---|---:|---:|---:|"]
    off_ms = Totals.of(totals["off"]).ms_per_token
    for method, entries in totals.items():
        t = Totals.of(entries)
        lines.append(f"| {method} | {t.ms_per_token:.2f} | {off_ms / t.ms_per_token:.2f}x | "
                     f"{t.accepted / t.steps:.2f} |")
    write_markdown(args.out, lines)


if __name__ == "__main__":
    main()
