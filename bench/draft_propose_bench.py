"""The draft-model proposer's propose time per step, its resident cache on and off.

    python bench/draft_propose_bench.py [--model models/draft] [--device auto] [--batch 1 8]
                                        [--k 4] [--steps 200] [--prompt-len 64]
                                        [--out bench/reports/draft-propose.md] [--smoke]

One session, `batch` sequences of random prompts, greedy; every step each sequence accepts a
random number of its last draft (0..k, seeded, the same run for every configuration) and a
random recovered token, and the session drafts k tokens for all of them (drafting ahead off:
the step's own proposal, what the verifier waits for). Timed: the wall time of `propose` for
the whole batch (it returns after the drafts are on the host), median and p90 over the steps
after 20 warm-up steps, per configuration:

    resident   --draft-cache-slots 64 (proposer_service/draft/slots.py): each sequence drafted
               in its slot, nothing copied in or out
    resident+chain  (--chain-k) the same with --draft-graph-chain-k K: the k iterations one
               captured graph, replayed once per step
    per-seq    --draft-cache-slots 0: every sequence keeps its own cache tensors (the eager path
               builds a padded batch cache per call; the captured loop copies each row in and
               out of a borrowed scratch row)

On an accelerator the captured loop serves both (warm_up captures it). A checkout from before
the resident cache existed has no `cache_slots`: there the script times that checkout's one path
and labels it "before" (copy this file into it to compare). Writes the report to --out.
"""

from __future__ import annotations

import argparse
import inspect
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proposer_service.draft.proposer import DraftModelProposer  # noqa: E402
from splitspec.device import resolve_device, resolve_dtype  # noqa: E402
from splitspec.params import SamplingParams  # noqa: E402
from splitspec.proposal import SequenceStep  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
WARM = 20


def time_steps(proposer: DraftModelProposer, batch: int, k: int, steps: int, prompt_len: int,
               seed: int = 0) -> list[float]:
    """Seconds of each timed step's propose."""
    rng = random.Random(seed)
    vocab = proposer.vocab_size
    session = proposer.open_session()
    histories = {f"s{i}": [rng.randrange(3, vocab) for _ in range(prompt_len)]
                 for i in range(batch)}
    work = [SequenceStep(sid, list(h), len(h), k, full_history=True, sampling=GREEDY,
                         draft_ahead=False) for sid, h in histories.items()]
    out = []
    for step in range(WARM + steps):
        start = time.perf_counter()
        drafts = session.propose(work)
        took = time.perf_counter() - start
        if step >= WARM:
            out.append(took)
        work = []
        for d in drafts:
            h = histories[d.seq_id]
            delta = d.tokens[:rng.randint(0, len(d.tokens))] + [rng.randrange(3, vocab)]
            if len(h) + len(delta) + 2 * k >= proposer.max_positions:  # start over
                session.release([d.seq_id])
                h[:] = [rng.randrange(3, vocab) for _ in range(prompt_len)]
                work.append(SequenceStep(d.seq_id, list(h), len(h), k, full_history=True,
                                         sampling=GREEDY, draft_ahead=False))
                continue
            h.extend(delta)
            work.append(SequenceStep(d.seq_id, delta, len(h), k, sampling=GREEDY,
                                     draft_ahead=False))
    session.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "draft"))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--chain-k", action="store_true",
                    help="also time the resident cache with the k iterations captured as one "
                         "graph (--draft-graph-chain-k K; an accelerator's graphs only)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "reports" / "draft-propose.md"))
    ap.add_argument("--smoke", action="store_true", help="a few steps: a harness check")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = 5 if args.smoke else args.steps
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    has_slots = "cache_slots" in inspect.signature(DraftModelProposer.__init__).parameters
    configs = [("resident", {"cache_slots": 64}), ("per-seq", {"cache_slots": 0})] \
        if has_slots else [("before", {})]
    if args.chain_k and has_slots:
        configs.insert(1, ("resident+chain", {"cache_slots": 64, "chain_ks": (args.k,)}))
    rows = []
    for name, kwargs in configs:
        proposer = DraftModelProposer.load(args.model, device, dtype, max_batch=max(args.batch),
                                           drafts_ahead=False, **kwargs)
        proposer.warm_up()
        graphs = proposer.graphs is not None and proposer.graphs.captured
        for batch in args.batch:
            times = time_steps(proposer, batch, args.k, steps, args.prompt_len)
            ms = sorted(t * 1e3 for t in times)
            rows.append((name, batch, graphs, statistics.median(ms),
                         ms[min(len(ms) - 1, int(0.9 * len(ms)))], len(ms),
                         dict(proposer.fallbacks.counts)))
            print(f"{name:9s} batch {batch}: median {rows[-1][3]:.3f} ms/step, "
                  f"p90 {rows[-1][4]:.3f} (graphs {graphs}, eager fallbacks {rows[-1][6]})",
                  flush=True)
    lines = ["# Draft proposer: propose time per step", "",
             f"`{' '.join(sys.argv)}` on {device} ({dtype}), model {args.model}, k {args.k}, "
             f"prompts of {args.prompt_len} tokens, greedy, drafting ahead off, "
             f"{steps} timed steps after {WARM} warm-up" + (" (smoke run: no speed figure)"
                                                          if args.smoke else ""), "",
             "| path | batch | captured loop | median ms/step | p90 ms/step | steps | eager "
             "fallbacks |", "|---|---|---|---|---|---|---|"]
    for name, batch, graphs, med, p90, n, fb in rows:
        lines.append(f"| {name} | {batch} | {'yes' if graphs else 'no'} | {med:.3f} | "
                     f"{p90:.3f} | {n} | {fb or '-'} |")
    by = {(name, batch): med for name, batch, _, med, _, _, _ in rows}
    if has_slots:
        lines += ["", "Per-sequence over resident (the resident cache's speed-up):", ""]
        lines += [f"- batch {b}: {by[('per-seq', b)] / by[('resident', b)]:.2f}x"
                  for b in args.batch]
        if args.chain_k:
            lines += ["", "Per-sequence over resident with the loop as one graph:", ""]
            lines += [f"- batch {b}: {by[('per-seq', b)] / by[('resident+chain', b)]:.2f}x"
                      for b in args.batch]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
