"""What a drafted token costs with the whole output head and with a vocabulary subset (FR-Spec).

    python bench/draft_head_bench.py [--draft DIR] [--mlp DIR] [--sizes auto 4096 2048]

For the real chat model's draft and MLP speculator (their directories' token_frequencies.json
ranks the tokens): one drafted token at batch 1 after 96 cached tokens, in the proposer's own
forward (the lean forward for the draft, the speculator's head step for the MLP), one torch
thread, the same matmul backend the proposer picks (`--linear auto`), best of 5 rounds of 30
calls; the head alone is timed the same way. Beside each size: the share of the held-out
answers' tokens the subset covers (from the frequency file). Writes
bench/reports/draft-head.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from forward_profile import _best_ms  # noqa: E402

from proposer_service.draft.proposer import DraftModelProposer  # noqa: E402
from proposer_service.mlp.proposer import MlpSpeculatorProposer  # noqa: E402
from splitspec.vocab_frequencies import FREQUENCIES  # noqa: E402

CPU = torch.device("cpu")


@torch.inference_mode()
def draft_costs(path: str, size: str) -> tuple[float, float]:
    """(one drafted token ms, its head ms) at batch 1 after 96 cached tokens."""
    p = DraftModelProposer.load(path, CPU, torch.float32, vocab_subset=size)
    lean = p.lean
    ids = torch.randint(0, 1000, (1, 96))
    _, kv = lean.forward(ids, torch.arange(96)[None], None, None, 1)
    one, pos = torch.tensor([[5]]), torch.tensor([[96]])
    x = torch.randn(1, 1, lean.embed.shape[1])
    return (_best_ms(lambda: lean.forward(one, pos, kv, None, 1)), _best_ms(lambda: lean.head(x)))


@torch.inference_mode()
def mlp_costs(path: str, size: str, tokenizer: str) -> tuple[float, float]:
    """(one head step ms: projection, norm and output head; its output head ms)."""
    p = MlpSpeculatorProposer.load(path, CPU, torch.float32, tokenizer=tokenizer,
                                   vocab_subset=size)
    m = p.model
    state = m.input_state(torch.randn(1, m.config.emb_dim))
    tok = torch.tensor([5])
    x = torch.randn(1, m.config.inner_dim)
    return _best_ms(lambda: m.step(state, tok, 0)), _best_ms(lambda: m.head[0](x))


def cov_at(table: dict, n: int, ranked: int) -> float:
    """Held-out coverage by the top n, as the frequency file lists it: at n itself, or, for a
    subset of every ranked token, at the largest size listed (no more tokens to add)."""
    if n >= ranked and table:
        return table[str(max(int(k) for k in table))]
    return table.get(str(n), float("nan"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--draft", default=str(ROOT / "models/smollm2-135m-instruct-draft"))
    ap.add_argument("--mlp", default=str(ROOT / "models/smollm2-135m-instruct-mlp-speculator"))
    ap.add_argument("--sizes", nargs="+", default=["auto", "4096", "2048", "1024"],
                    help="subset sizes (auto: the frequency file's recommended one)")
    ap.add_argument("--out", default=str(ROOT / "bench/reports/draft-head.md"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    freq = json.loads((Path(args.draft) / FREQUENCIES).read_text())
    coverage = freq.get("heldout_coverage", {})
    vocab = json.loads((Path(args.target) / "config.json").read_text())["vocab_size"]
    lines = ["# Output-head cost per drafted token: whole vocabulary and frequency-ranked subsets",
             "", __doc__.split("\n\n")[2].replace("\n", " "), "",
             f"Frequency file: {freq['source']}, {freq['counted_tokens']} tokens counted, "
             f"{len(freq['ranked_ids'])} distinct; recommended subset "
             f"{freq.get('recommended_subset')}.", "",
             "| head | draft token ms | draft head ms | MLP step ms | MLP head ms | "
             "held-out coverage chat / code |", "|---|---:|---:|---:|---:|---|"]
    recommended = str(freq.get("recommended_subset") or 0)
    for size in ["0", *args.sizes]:
        size = recommended if size == "auto" else size
        d_tok, d_head = draft_costs(args.draft, size)
        m_tok, m_head = mlp_costs(args.mlp, size, args.target)
        ranked = len(freq["ranked_ids"])
        cov = "1.00 / 1.00" if size == "0" else " / ".join(
            f"{cov_at(coverage.get(kind, {}), int(size), ranked):.3f}" for kind in ("chat", "code"))
        name = f"whole vocabulary ({vocab})" if size == "0" else f"{size} most frequent"
        lines.append(f"| {name} | {d_tok:.2f} | {d_head:.2f} | {m_tok:.2f} | {m_head:.2f} | "
                     f"{cov} |")
        print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
