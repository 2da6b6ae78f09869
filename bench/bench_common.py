"""What the benchmark scripts share: the start of their command line, one timed greedy
completion through the gateway, the sums over a configuration's responses, and writing the
markdown report (to --out and to stdout).

Imported by the scripts in bench/ (run as `python bench/NAME.py`, so bench/ is on sys.path and
they have put the repository root there too)."""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from splitspec.config import DEFAULT_MODEL

ROOT = Path(__file__).resolve().parent.parent

Response = tuple[float, str, dict]  # seconds seen by the client, the text, the usage body


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """The script's parser: its docstring as the description, and --model (the target)."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / DEFAULT_MODEL))
    return ap


def device_parser(doc: str | None) -> argparse.ArgumentParser:
    """The accelerator scripts' parser (bench/gpu_bench.py, bench/step_profile.py): the toy
    target by default, the device, and the dtype (`device_dtype` resolves its default)."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models/target"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    return ap


def device_dtype(args: argparse.Namespace) -> str:
    """--dtype as given, else bfloat16 on an accelerator and float32 on the CPU."""
    return args.dtype or ("bfloat16" if args.device != "cpu" else "float32")


def interleaved_parser(doc: str | None, concurrency: int) -> argparse.ArgumentParser:
    """bench_parser plus the options of the benchmarks that interleave stacks of different
    configurations round by round (bench/observability_bench.py, bench/tls_bench.py)."""
    ap = bench_parser(doc)
    ap.add_argument("--quick", action="store_true", help="a short run to check the harness")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=4,
                    help="the stacks are started afresh this many times over the run")
    ap.add_argument("--concurrency", type=int, default=concurrency, help="clients per round")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--out", default=None)
    return ap


def timed_completion(client: httpx.Client, prompt: str, max_tokens: int, method: str,
                     k: int) -> Response:
    """One greedy completion of max_tokens tokens (EOS ignored), speculation off for method
    "off" and on with (method, k) otherwise."""
    spec = ({"mode": "off"} if method == "off" else
            {"mode": "on", "method": method, "num_speculative_tokens": k})
    t0 = time.perf_counter()
    resp = client.post("/v1/completions", json={
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "speculation": spec})
    elapsed = time.perf_counter() - t0
    resp.raise_for_status()
    body = resp.json()
    return elapsed, body["choices"][0]["text"], body["usage"]


@dataclass(frozen=True)
class Totals:
    """A configuration's responses summed: mean client ms per output token, output tokens,
    verifier steps, draft tokens proposed and accepted."""

    ms_per_token: float
    tokens: int
    steps: int
    proposed: int
    accepted: int

    @classmethod
    def of(cls, responses: list[Response]) -> "Totals":
        def spec(field: str) -> int:
            return sum(u["speculation"][field] for _, _, u in responses)

        return cls(statistics.mean(e / u["completion_tokens"] for e, _, u in responses) * 1000,
                   sum(u["completion_tokens"] for _, _, u in responses), spec("steps"),
                   spec("proposed_tokens"), spec("accepted_tokens"))


def identical(responses: list[Response], off: list[Response]) -> str:
    """"yes" when every text equals speculation off's for the same prompt, else "NO"."""
    return "yes" if all(t == o[1] for (_, t, _), o in zip(responses, off)) else "NO"


def write_markdown(out: str | Path, lines: list[str]) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def markdown_table(columns: dict[str, str], rows: list[list[object]]) -> list[str]:
    """A Markdown table's lines: `columns` maps each header to its alignment ("l" or "r"),
    every row is that many cells (str() of each)."""
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in columns.values()) + "|"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
