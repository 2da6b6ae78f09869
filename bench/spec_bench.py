"""End-to-end speculation benchmark through the real services (gateway -> verifier -> proposers).

    python bench/spec_bench.py [--model DIR] [--max-tokens 96] [--prompts 12] [--k 2 4 6]

Starts the local stack on free ports, then sends the same greedy requests one at a time with
speculation off and with each served proposer and k, interleaved round by round so that noise
from the shared machine hits every configuration alike. Reported per configuration: mean
latency per output token seen by the client, speedup vs off (ratio of the means, same run),
tokens per verifier step, acceptance rate, and whether every output was identical to the
speculation-off output (it must be). Writes bench/reports/speculation.md.
"""

from __future__ import annotations

import json
import platform
import sys
import sysconfig
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_common import (  # noqa: E402
    Totals,
    bench_parser,
    identical,
    markdown_table,
    timed_completion,
    write_markdown,
)

from splitspec.launcher import Stack, StackConfig, sibling_proposer_models  # noqa: E402

FALLBACK_PROMPTS = [
    "def fibonacci(n):\n", "import json\n\nclass Config:\n    def __init__(self, path):\n",
    "for line in sys.stdin:\n", "    def __repr__(self):\n", "if __name__ == '__main__':\n",
    "def read_file(path):\n    with open(path) as f:\n",
]


def _held_out_texts() -> list[str]:
    """The held-out source files of the model family's split (models/split.json: paths relative
    to the Python standard library they were taken from), else the shipped sample of them."""
    split = ROOT / "models/split.json"
    texts: list[str] = []
    if split.exists():
        meta = json.loads(split.read_text())
        bases = [Path(meta.get("stdlib", "")), Path(sysconfig.get_paths()["stdlib"])]
        for name in meta.get("heldout_files", []):
            for base in bases:
                try:
                    texts.append((base / name).read_text(encoding="utf-8"))
                    break
                except (OSError, UnicodeDecodeError):
                    continue
    sample = ROOT / "models/heldout-sample.json"
    if not texts and sample.exists():
        texts = [entry["text"] for entry in json.loads(sample.read_text())]
    return texts


def held_out_prompts(n: int, chars: int = 400) -> list[str]:
    """n distinct prompts cut from held-out source files (never trained on): one window per
    file first, starting a third of the way in at a line start, then the files' further
    non-overlapping windows (onwards, then from their start); the fixed fallback prompts only
    when the held-out text runs out."""
    texts = [t for t in _held_out_texts() if len(t) > 2 * chars]
    starts = [list(range(len(t) // 3, len(t) - chars, chars))
              + list(range(0, len(t) // 3 - chars, chars)) for t in texts]
    out: list[str] = []
    for window in range(max((len(s) for s in starts), default=0)):
        for text, offsets in zip(texts, starts):
            if window < len(offsets):
                start = text.find("\n", offsets[window]) + 1
                if 0 < start and start + chars <= len(text):
                    out.append(text[start:start + chars])
                    if len(out) == n:
                        return out
    return (out + FALLBACK_PROMPTS * n)[:n]


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4, 6])
    ap.add_argument("--verifier-threads", type=int, default=0,
                    help="torch threads in the verifier and learned proposers (0: torch "
                         "default); 1 on a busy machine")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/speculation.md"))
    args = ap.parse_args()
    prompts = held_out_prompts(args.prompts)
    models = sibling_proposer_models(args.model)  # as `splitspec up` finds them
    threads = ["--threads", str(args.verifier_threads)] if args.verifier_threads else []
    config = StackConfig.with_free_ports(model=args.model, device="cpu", models=models,
                                         proposer_args={m: threads for m in models},
                                         log_dir=ROOT / "bench/out/logs",
                                         verifier_args=["--proposer-timeout-ms", "2000",
                                                        "--threads", str(args.verifier_threads)])
    with Stack(config) as stack, httpx.Client(base_url=stack.url, timeout=300) as client:
        methods = client.get("/v1/models").json()["data"][0]["speculation_methods"]
        configs = [("off", 0)] + [(m, k) for m in methods for k in args.k]
        results = {c: [] for c in configs}
        for prompt in prompts:
            for method, k in configs:  # interleaved: noise hits every configuration alike
                results[(method, k)].append(
                    timed_completion(client, prompt, args.max_tokens, method, k))
    off = results[("off", 0)]
    off_ms = Totals.of(off).ms_per_token
    lines = [
        "# Speculative decoding, end to end", "",
        f"Target `{Path(args.model).name}`; {len(prompts)} prompts, {args.max_tokens} greedy "
        f"tokens each, one request at a time through gateway -> verifier -> proposer over gRPC "
        f"on 127.0.0.1 ({platform.machine()} CPU). Configurations interleaved per prompt; ratios "
        f"are within this run. Produced by `python bench/spec_bench.py`.", "",
    ]
    table = []
    for (method, k), rows in results.items():
        t = Totals.of(rows)
        table.append([method, k or "-", f"{t.ms_per_token:.2f}", f"{off_ms / t.ms_per_token:.2f}x",
                      f"{t.tokens / t.steps:.2f}",
                      f"{(t.accepted / t.proposed) if t.proposed else 0:.2f}",
                      identical(rows, off)])
    columns = {"method": "l", "k": "r", "ms / token": "r", "speedup vs off": "r",
               "tokens / step": "r", "acceptance rate": "r", "identical to off": "l"}
    write_markdown(args.out, lines + markdown_table(columns, table))


if __name__ == "__main__":
    main()
