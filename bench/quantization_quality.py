"""What `--quantization int8` costs in quality: perplexity on held-out text with the target's
products as the checkpoint has them (fp16-dot: the fp16 values, fp32 arithmetic) against int8
weights (int8-dot, kernels/int8_dot.py), the output head int8 as served and, for comparison, the
head kept in fp16; and how often the int8 model's next-token argmax is the fp16 model's.

The text is scored in windows of at most the model's context, every token but each window's
first predicted from those before it (the transformers forward, its nn.Linear products swapped
for the packed ones: the same weights and per-row arithmetic as the verifier's lean forward).

    python bench/quantization_quality.py                                  # the real model
    python bench/quantization_quality.py --model models/target --text models/heldout-sample.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REAL_MODEL = "models/smollm2-135m-instruct"
TEXT = "bench/data/heldout/prose.txt"  # paragraphs written for this measurement
VARIANTS = (("fp16", "fp16-dot", "fp16-dot"), ("int8 (as served)", "int8-dot", "int8-dot"),
            ("int8, fp16 head", "int8-dot", "fp16-dot"))  # name, layers, head


def read_text(path: str) -> list[str]:
    """The documents of a held-out file: a .json list of {"text": ...} (the toy family's
    held-out sample) or a plain text file (one document)."""
    raw = Path(path).read_text()
    if path.endswith(".json"):
        return [d["text"] for d in json.loads(raw)]
    return [raw]


def windows(ids: list[int], size: int) -> list[list[int]]:
    """ids in consecutive windows of at most `size` tokens (each scored on its own)."""
    return [ids[i:i + size] for i in range(0, len(ids), size) if len(ids[i:i + size]) > 1]


def perplexity(nll_sum: float, count: int) -> float:
    return math.exp(nll_sum / count)


def _model(model_dir: str, layers: str, head: str):
    import torch

    from kernels.linear import pack_linears
    from splitspec.modelio import load_causal_lm

    model = load_causal_lm(model_dir, torch.device("cpu"), torch.float32,
                           attn_implementation="sdpa")
    pack_linears(model.get_decoder(), layers)
    pack_linears(model, head)  # what is left: the output head
    return model.eval()


def score(model_dir: str, docs: list[str], window: int, log=print) -> dict:
    """Per variant: (summed NLL, tokens scored, argmax per scored position)."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    chunks = [w for d in docs for w in windows(tok.encode(d, add_special_tokens=False), window)]
    out = {}
    for name, layers, head in VARIANTS:
        model = _model(model_dir, layers, head)
        nll, count, argmax = 0.0, 0, []
        with torch.inference_mode():
            for ids in chunks:
                x = torch.tensor([ids])
                logp = torch.log_softmax(model(x).logits[0, :-1].double(), dim=-1)
                nll -= float(logp.gather(1, x[0, 1:, None]).sum())
                count += len(ids) - 1
                argmax.append(logp.argmax(dim=-1))
        out[name] = (nll, count, torch.cat(argmax))
        log(f"{name}: perplexity {perplexity(nll, count):.3f} over {count} tokens")
        del model
    return out


def report(scores: dict, model: str, text: str) -> list[str]:
    base = scores[VARIANTS[0][0]][2]
    rows = ["| weights | perplexity | vs fp16 | next-token argmax as fp16's |", "|---|---|---|---|"]
    ref = perplexity(*scores[VARIANTS[0][0]][:2])
    for name, (nll, count, argmax) in scores.items():
        ppl = perplexity(nll, count)
        rows.append(f"| {name} | {ppl:.3f} | {ppl / ref - 1:+.2%} | "
                    f"{float((argmax == base).double().mean()):.2%} |")
    count = scores[VARIANTS[0][0]][1]
    return [f"Model `{model}`, text `{text}` ({count} tokens scored):", "", *rows]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / REAL_MODEL))
    p.add_argument("--text", default=str(ROOT / TEXT))
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    scores = score(args.model, read_text(args.text), args.window,
                   log=lambda s: print(s, file=sys.stderr, flush=True))
    print("\n".join(report(scores, Path(args.model).name, Path(args.text).name)))


if __name__ == "__main__":
    main()
