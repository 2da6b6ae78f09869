"""What mutual TLS costs: tokens/s at batch 1 through the real services with TLS on and off.

    python bench/tls_bench.py [--quick] [--rounds 20] [--blocks 4] [--concurrency 1]

Two stacks (gateway + verifier + n-gram proposer each, the toy family's target by default) run
side by side on free ports, the harness of bench/observability_bench.py:
  off   plaintext on every hop (`make run`'s default)
  tls   `splitspec up --tls`'s setup: mutual TLS on every gRPC hop (verifiers serving only the
        gateway, proposers only verifiers) and HTTPS at the REST door, with throwaway
        certificates (splitspec/tls_certs.py)
Each round sends the same workload (one client by default: batch 1, greedy, n-gram speculation,
a fixed number of output tokens; each client opens one HTTPS connection per round, so a handshake
is counted every round) to each stack in turn, the order alternating per round; the stacks are
restarted every block of rounds. Reported: output tokens/s per configuration (median over
rounds), the median of the per-round ratios, and the services' CPU time per token.
Writes bench/reports/tls.md (with --quick: bench/out/tls-quick.md).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_common import interleaved_parser  # noqa: E402
from observability_bench import run_round  # noqa: E402

from splitspec.launcher import Stack, StackConfig  # noqa: E402
from splitspec.tls_certs import write_stack_certificates  # noqa: E402

CONFIGS = ("off", "tls")


def main() -> None:
    args = interleaved_parser(__doc__, concurrency=1).parse_args()  # batch 1
    if args.quick:
        args.rounds, args.blocks, args.max_tokens, args.requests_per_client = 3, 1, 16, 1
    out = Path(args.out or ROOT / ("bench/out/tls-quick.md" if args.quick
                                   else "bench/reports/tls.md"))
    results: dict[str, list[float]] = {c: [] for c in CONFIGS}
    cpu: dict[str, list[float]] = {c: [] for c in CONFIGS}
    per_block = -(-args.rounds // args.blocks)
    with tempfile.TemporaryDirectory(prefix="splitspec-tls-bench-") as tmp:
        certs = write_stack_certificates(Path(tmp))
        verify = {"off": True, "tls": str(certs.ca)}
        for block in range(args.blocks):
            stacks: dict[str, Stack] = {}
            try:
                for c in CONFIGS:
                    stacks[c] = Stack(StackConfig.with_free_ports(
                        model=args.model, device="cpu", methods=["ngram"], metrics_port=0,
                        log_dir=ROOT / f"bench/out/tls-logs/{c}",
                        verifier_args=["--threads", "1", "--proposer-timeout-ms", "2000"],
                        tls=certs if c == "tls" else None))
                    stacks[c].start()
                for c in CONFIGS:  # warm-up round, not counted
                    run_round(stacks[c], args.concurrency, 1, 8, args.k, verify[c])
                for r in range(block * per_block, min(args.rounds, (block + 1) * per_block)):
                    for c in (CONFIGS if r % 2 == 0 else CONFIGS[::-1]):
                        tok_s, cpu_ms = run_round(stacks[c], args.concurrency,
                                                  args.requests_per_client, args.max_tokens,
                                                  args.k, verify[c])
                        results[c].append(tok_s)
                        cpu[c].append(cpu_ms)
                    print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                        f"{c} {results[c][-1]:.1f} tok/s {cpu[c][-1]:.2f} cpu-ms/tok"
                        for c in CONFIGS), flush=True)
            finally:
                for st in stacks.values():
                    st.stop()

    ratios = [t / o for t, o in zip(results["tls"], results["off"])]
    ratio = statistics.median(ratios)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio, ratio, ratio]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    def row(c: str) -> str:
        return (f"{statistics.median(results[c]):.1f} | {min(results[c]):.1f} | "
                f"{max(results[c]):.1f} | {statistics.median(cpu[c]):.3f}")

    cpu_ratio = statistics.median(cpu["tls"]) / statistics.median(cpu["off"])
    lines = [
        "# TLS overhead", "",
        f"Target `{Path(args.model).name}`, n-gram speculation (k={args.k}), "
        f"{args.concurrency} client(s) x {args.requests_per_client} requests x "
        f"{args.max_tokens} greedy tokens per round (batch {args.concurrency}), {args.rounds} "
        f"rounds in {args.blocks} blocks (fresh processes per block), the two stacks interleaved "
        f"with alternating order ({platform.machine()} CPU, {os.cpu_count()} cores, load "
        f"average {load:.2f} at the end). `tls`: mutual TLS on the gateway -> verifier and "
        f"verifier -> proposer hops and HTTPS at the REST door (a new connection per client "
        f"and round). Produced by `python bench/tls_bench.py{' --quick' if args.quick else ''}`"
        f" (`make bench-tls`).", "",
        "| configuration | tokens/s (median) | min | max | service CPU ms per token (median) |",
        "|---|---:|---:|---:|---:|",
        f"| off (plaintext) | {row('off')} |",
        f"| tls (mutual TLS, HTTPS) | {row('tls')} |", "",
        f"TLS vs off, median of the per-round ratios: **{ratio:.3f} "
        f"({(ratio - 1) * 100:+.1f}% tokens/s)**, interquartile range {q[0]:.3f} to {q[2]:.3f}; "
        f"CPU per token {(cpu_ratio - 1) * 100:+.1f}%.", "",
        f"Budget: TLS costs at most 5% of tokens/s at batch 1 "
        f"({'met' if ratio >= 0.95 else 'NOT met'}).",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
