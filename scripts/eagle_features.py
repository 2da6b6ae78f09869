"""The target's features for the engine-generated answers (scripts/eagle_engine_data.py), by one
batched teacher-forced forward over prompt + answer, saved as scripts/eagle_data.py's records.

    python scripts/eagle_features.py [--data data/eagle-real] [--work runs/eagle-real]

Why a second pass and not features kept during generation: the engine decodes from its paged KV
cache and hands out tokens, not the inputs of chosen layers; the answers are greedy, so the
causal forward over the finished sequence computes, at every position, the same residual stream
the generating step computed (the same prefix, the same weights), and with it the top-k labels.
A forward over the whole sequence at once is also far cheaper per token than a decode step. The
argmax of that forward is compared with each answer token (`agreement` in the log and in
features.json): 1.0 up to the rare near-tie the engine's kernels resolve the other way.

Shard NNNN of the data becomes runs/eagle-real/train-engine/chunk-NNNN.pt; a rerun computes only
the shards it has not done yet.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import eagle_data as ed  # noqa: E402
import eagle_engine_data as eed  # noqa: E402

REPO = eed.REPO


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@torch.no_grad()
def teacher_forced(model, seqs: list[list[int]], layer_ids: list[int], top_k: int):
    """One right-padded forward over sequences: per sequence (feats fp16 [L - 1, 3, H], top_ids
    int32 [L - 1, K], top_logp fp16 [L - 1, K], argmax [L - 1]) for every position but the last."""
    L = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), L, dtype=torch.long)
    mask = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    tap = ed.FeatureTap(model, layer_ids)
    try:
        h = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        feats = tap.take()
    finally:
        tap.close()
    out = []
    for i, s in enumerate(seqs):
        n = len(s) - 1
        logp = model.lm_head(h[i, :n]).float().log_softmax(-1)
        top = logp.topk(top_k, -1)
        out.append((feats[i, :n].to(torch.float16).clone(), top.indices.to(torch.int32),
                    top.values.to(torch.float16), top.indices[:, 0]))
    return out


def shard_records(model, answers: list[dict], layer_ids: list[int], top_k: int, batch: int
                  ) -> tuple[list[dict], int, int]:
    """Records (eagle_data's layout, part "train") of one shard's answers; with (answer tokens
    whose teacher-forced argmax is the token the engine emitted, answer tokens)."""
    order = sorted(range(len(answers)), key=lambda i: len(answers[i]["prompt_ids"])
                   + len(answers[i]["answer_ids"]))
    recs: dict[int, dict] = {}
    same = total = 0
    for b in range(0, len(order), batch):
        idx = order[b:b + batch]
        seqs = [answers[i]["prompt_ids"] + answers[i]["answer_ids"] for i in idx]
        for i, s, (feats, top_i, top_p, arg) in zip(idx, seqs,
                                                   teacher_forced(model, seqs, layer_ids, top_k)):
            a, P = answers[i], len(answers[i]["prompt_ids"])
            same += int((arg[P - 1:] == torch.tensor(s[P:])).sum())
            total += len(s) - P
            recs[i] = {"kind": a["kind"], "category": a["category"], "part": "train",
                       "tokens": torch.tensor(s, dtype=torch.int32), "prompt_len": P,
                       "feats": feats, "top_ids": top_i, "top_logp": top_p}
    return [recs[i] for i in range(len(answers))], same, total


def chunk_path(work: Path, shard: Path) -> Path:
    n = shard.name.split("-")[1].split(".")[0]
    return work / "train-engine" / f"chunk-{n}.pt"


def run(a, log=log) -> None:
    from transformers import AutoModelForCausalLM

    cfg = json.loads((a.model / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    layers = [2, n // 2, n - 3]  # the EAGLE-3 default the shipped head uses
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    stats_path = a.work / "features.json"
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else {"shards": {}}
    deadline = time.time() + a.minutes * 60
    for shard in eed.shard_paths(a.data):
        out = chunk_path(a.work, shard)
        if out.exists():
            continue
        if time.time() > deadline:
            log("features: wall-clock cap reached (rerun to resume)")
            break
        t0, c0 = time.time(), time.process_time()
        answers = eed.load_answers_of(shard)
        recs, same, total = shard_records(model, answers, layers, a.top_k, a.batch)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        torch.save(recs, tmp)
        tmp.replace(out)
        secs = time.time() - t0
        stats["shards"][shard.name] = {"answers": len(recs), "answer_tokens": total,
                                       "argmax_agreement": same / max(total, 1),
                                       "seconds": round(secs, 1),
                                       "cpu_seconds": round(time.process_time() - c0, 1)}
        stats_path.write_text(json.dumps(stats, indent=1) + "\n")
        log(f"features: {out.name} ({len(recs)} answers, {total} answer tokens, argmax "
            f"agreement {same / max(total, 1):.4f}, {secs:.0f} s)")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=REPO / "models/smollm2-135m-instruct")
    p.add_argument("--data", type=Path, default=eed.DATA)
    p.add_argument("--work", type=Path, default=REPO / "runs/eagle-real")
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    run(a)


if __name__ == "__main__":
    main()
