"""Trains EAGLE-3 heads on the target's own features, for both model families, and writes each
head's model card. `make models-eagle` runs it.

    python scripts/train_eagle.py --family real                 # every stage in turn
    python scripts/train_eagle.py --family real --stages train,eval
    python scripts/train_eagle.py --family toy

Families (the head directory follows the launcher's naming, splitspec/methods.py):
  real  SmolLM2-135M-Instruct (models/smollm2-135m-instruct) -> models/smollm2-135m-instruct-eagle
  toy   the 5-layer code model (models/target) -> models/target-eagle

Stages (each reads what the earlier ones left under runs/eagle-<family>/, git-ignored):
  prompts  real: the chat model writes user requests for everyday chat and programming
           (scripts/eagle_topics.py: a category's instruction, two worked examples, a topic),
           sampled; requests overlapping the held-out set (scripts/eagle_heldout.py) dropped.
  data     the target answers greedily; its features (the three feature layers' inputs), its
           top-8 next-token log-probabilities and its tokens at every position are kept
           (scripts/eagle_data.py), in resumable chunks. real: held-out = the 80 hand-written
           prompts; toy: continuations of windows of the standard library's train split, held
           out = windows of the held-out files (models/split.json).
  vocab    the draft vocabulary: the tokens the target says most in its training answers
           (d2t/t2d of the EAGLE-3 format), with held-out coverage.
  train    the head, with EAGLE-3's training-time test (several drafting steps on its own
           fed-back states); fp16 EAGLE-3 checkpoint, each file at most 64 MB.
  eval     held-out acceptance per position (chains), tokens per step of EAGLE-2 trees at
           several node budgets, the MLP speculator and the draft on the same answers (real),
           and the head directory's README.md.

One thread (train beside other work); wall-clock caps per stage (--*-minutes).
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
import eagle_heldout  # noqa: E402
import eagle_topics  # noqa: E402
import model_family as mf  # noqa: E402

REPO = mf.REPO
STAGES = ("prompts", "data", "vocab", "train", "eval")
FAMILIES = {
    # target dir, head dir, feature layers (None: the default 2, L // 2, L - 3)
    "real": (REPO / "models/smollm2-135m-instruct", REPO / "models/smollm2-135m-instruct-eagle",
             None),
    # five layers: the defaults would name layer 2 three times, so the ids are explicit
    "toy": (REPO / "models/target", REPO / "models/target-eagle", [1, 3, 4]),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def heldout_prompts() -> list[dict]:
    return ([{"kind": "chat", "category": "heldout", "prompt": p} for p in eagle_heldout.CHAT]
            + [{"kind": "code", "category": "heldout", "prompt": p} for p in eagle_heldout.CODE])


def feature_layers(a, target_cfg: dict) -> list[int]:
    if a.layers is not None:
        return a.layers
    n = target_cfg["num_hidden_layers"]
    return [2, n // 2, n - 3]


def load_target(a):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


# -- stages --------------------------------------------------------------------------------------

ROUNDS = ("main", "code", "docstrings")  # prompt files, answered in this order


def prompts_file(a, name: str) -> Path:
    return a.work / ("prompts.json" if name == "main" else f"prompts-{name}.json")


def train_dir(a, name: str) -> Path:
    return a.work / ("train" if name == "main" else f"train-{name}")


def stage_prompts(a) -> None:
    """Every round of training requests not written yet: main (every category), code (another
    sample of the programming categories alone), docstrings (code requests over the first lines
    of the standard library's train-split docstrings, scripts/train_real.py's code prompts)."""
    if a.family != "real":
        log("prompts: the toy family continues code, no requests to write")
        return
    held = [p["prompt"] for p in heldout_prompts()]
    minutes = {"main": a.prompts_minutes, "code": a.prompts_minutes / 2, "docstrings": 0}
    for name in ROUNDS:
        path = prompts_file(a, name)
        if path.exists() and not a.force_prompts:
            log(f"prompts: {path.name} exists (--force-prompts writes new ones)")
            continue
        if name == "docstrings":
            import train_real

            _, code = train_real.build_prompts()
            reqs = [{"category": "docstring", "kind": "code", "topic": "", "prompt": c}
                    for c in code if not ed.overlaps(c, held)][:a.docstring_prompts]
        else:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(a.target, local_files_only=True)
            cats = [c for c in eagle_topics.CATEGORIES if name == "main" or c.kind == "code"]
            reqs = ed.write_requests(load_target(a), tok, cats, held, a.per_pair,
                                     a.seed + ROUNDS.index(name), minutes[name], log)
        a.work.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(reqs, indent=1) + "\n")
        kinds = {k: sum(r["kind"] == k for r in reqs) for k in ("chat", "code")}
        log(f"prompts: {len(reqs)} requests saved to {path.name} ({kinds})")


def check_no_overlap(items: list[dict]) -> None:
    """Stop if any training request shares a long word sequence with a held-out prompt."""
    held = [p["prompt"] for p in heldout_prompts()]
    bad = [it["prompt"] for it in items if ed.overlaps(it["prompt"], held)]
    if bad:
        raise SystemExit(f"{len(bad)} training requests overlap the held-out set, e.g. {bad[0]!r}")


def stage_data(a) -> None:
    target_cfg = json.loads((a.target / "config.json").read_text())
    layers = feature_layers(a, target_cfg)
    model = load_target(a)
    if a.family == "real":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(a.target, local_files_only=True)
        val = [dict(it, part="val") for it in heldout_prompts()]
        log(f"data: feature layers {layers}; {len(val)} held-out requests")
        deadline = time.time() + a.data_minutes * 60
        ed.answer_prompts(model, tok, val, layers, a.work / "val", a.gen_tokens, a.gen_batch,
                          a.top_k, deadline, log)
        rounds = {}
        for name in ROUNDS:
            if prompts_file(a, name).exists():
                items = json.loads(prompts_file(a, name).read_text())
                check_no_overlap(items)
                rounds[name] = ed.sort_by_length([dict(it, part="train") for it in items], tok,
                                                 a.gen_batch)
                log(f"data: {len(items)} training requests of round {name}")
        # chunk i of every round before chunk i + 1 of any: a cap leaves each round its share
        most = max((ed.num_chunks(items, a.gen_batch) for items in rounds.values()), default=0)
        for i in range(most):
            for name, items in rounds.items():
                if not ed.answer_prompts(model, tok, items, layers, train_dir(a, name),
                                         a.gen_tokens, a.gen_batch, a.top_k, deadline, log,
                                         chunks=[i]):
                    log(f"data: wall-clock cap of {a.data_minutes} min reached (rerun to resume)")
                    return
    else:
        tok = mf.load_tokenizer(a.target)
        train_files, held_files = mf.split_files(mf.CorpusConfig())
        log(f"data: feature layers {layers}; {len(train_files)} train files, "
            f"{len(held_files)} held-out files")
        deadline = time.time() + a.data_minutes * 60
        ed.continue_windows(model, ed.code_windows(tok, held_files, 80, a.toy_prompt_len, 3),
                            "val", layers, a.work / "val", a.gen_tokens, a.gen_batch, a.top_k,
                            deadline, log)
        ed.continue_windows(model, ed.code_windows(tok, train_files, a.toy_windows,
                                                   a.toy_prompt_len, 4),
                            "train", layers, a.work / "train", a.gen_tokens, a.gen_batch,
                            a.top_k, deadline, log)


def load_train(a) -> list[dict]:
    """Every training round's answers (train/, train-*/)."""
    return [r for d in sorted(a.work.glob("train*")) if d.is_dir()
            for r in ed.load_records(d)]


def stage_vocab(a) -> None:
    """The draft vocabulary (--draft-vocab tokens, the whole vocabulary when that is smaller):
    the tokens the target says in its training answers, most frequent first (with the counts its
    other speculators were ranked by, when they exist), then the lowest token ids not counted (a
    byte-level BPE numbers its merges in the order its corpus made them, so low ids are its
    common pieces); with the held-out answers' coverage."""
    from collections import Counter

    vocab = json.loads((a.target / "config.json").read_text())["vocab_size"]
    train = load_train(a)
    counts = Counter(t for r in train for t in r["tokens"][r["prompt_len"]:].tolist())
    own = sum(counts.values())
    for d in (Path(f"{a.target}-draft"), Path(f"{a.target}-mlp-speculator")):
        if (d / "token_frequencies.json").exists():
            freq = json.loads((d / "token_frequencies.json").read_text())
            counts.update(dict(zip(freq["ranked_ids"], freq["counts"])))
            log(f"vocab: with {freq['counted_tokens']} counted tokens of {d.name}")
            break
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    total = sum(counts.values())
    n = min(vocab, a.draft_vocab)
    picked = ranked[:n]
    seen = set(picked)
    picked += [t for t in range(vocab) if t not in seen][:n - len(picked)]
    ids = sorted(picked)
    chosen = set(ids)
    val = ed.load_records(a.work / "val")
    coverage = {}
    for kind in ("chat", "code"):
        held = [t for r in val if r["kind"] == kind for t in r["tokens"][r["prompt_len"]:].tolist()]
        if held:
            coverage[kind] = round(sum(t in chosen for t in held) / len(held), 4)
    info = {"draft_vocab_size": len(ids), "distinct_answer_tokens": len(counts),
            "answer_tokens": total, "own_answer_tokens": own, "train_coverage": round(
                sum(counts[t] for t in chosen if t in counts) / total, 4),
            "heldout_coverage": coverage, "ids": ids}
    (a.work / "vocab.json").write_text(json.dumps(info) + "\n")
    log(f"vocab: {len(ids)} draft tokens of {vocab} ({len(counts)} distinct in {total} answer "
        f"tokens); train coverage {info['train_coverage']}, held-out {coverage}")


def stage_train(a) -> None:
    import eagle_fit

    eagle_fit.train(a, log)


def stage_eval(a) -> None:
    import eagle_fit

    eagle_fit.evaluate(a, log)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES), default="real")
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--work", type=Path, help="default runs/eagle-<family>")
    p.add_argument("--out", type=Path, help="the head directory (default: next to the target)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--per-pair", type=int, default=2,
                   help="prompts: requests sampled per (category, topic) and category weight")
    p.add_argument("--prompts-minutes", type=float, default=40)
    p.add_argument("--force-prompts", action="store_true")
    p.add_argument("--docstring-prompts", type=int, default=600)
    p.add_argument("--gen-batch", type=int, default=32)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8, help="data: soft labels kept per position")
    p.add_argument("--data-minutes", type=float, default=240)
    p.add_argument("--toy-windows", type=int, default=2048, help="toy data: training windows")
    p.add_argument("--toy-prompt-len", type=int, default=96)
    p.add_argument("--draft-vocab", type=int, default=16384,
                   help="vocab: draft vocabulary size (the whole vocabulary when smaller)")
    p.add_argument("--ttt-steps", type=int, default=4, help="train: drafting steps per record")
    p.add_argument("--ttt-decay", type=float, default=0.8, help="train: weight of step s: decay^s")
    p.add_argument("--prompt-weight", type=float, default=0.0,
                   help="train: weight of rows predicting prompt tokens (0: answer rows only)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--scale-features", type=int, default=1,
                   help="train: fc reads features scaled to unit RMS per dimension (folded into "
                   "fc when saved); 0: raw")
    p.add_argument("--code-weight", type=float, default=1.0,
                   help="train: a code answer is drawn this many times as often as a chat answer "
                   "(1: uniform, without replacement within a batch)")
    p.add_argument("--batch", type=int, default=4, help="train: records per optimiser step")
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--train-minutes", type=float, default=120)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--init", type=Path, help="train: start from this head's weights and draft "
                   "vocabulary (e.g. the shipped head) instead of a fresh one")
    p.add_argument("--resume", action="store_true", help="train: continue from the checkpoint "
                   "under runs/ (its optimiser state and step)")
    p.add_argument("--eval-k", type=int, default=6, help="eval: chain length measured")
    p.add_argument("--tree", default="4,6", help="eval: top_k,depth of the EAGLE-2 trees")
    p.add_argument("--budgets", default="4,6,8,12,16,24,32",
                   help="eval: node budgets the trees are measured at")
    p.add_argument("--tree-records", type=int, default=20,
                   help="eval: held-out answers of each kind the trees are measured on")
    p.add_argument("--skip-others", action="store_true",
                   help="eval: do not measure the MLP speculator and the draft")
    a = p.parse_args(argv)
    a.target, default_out, a.layers = FAMILIES[a.family]
    a.out = a.out or default_out
    a.work = a.work or REPO / "runs" / f"eagle-{a.family}"
    torch.set_num_threads(a.threads)
    if not (a.target / "config.json").exists():
        raise SystemExit(f"{a.target} is missing (make real-model / make models)")
    mf.run_stages(p, a.stages, STAGES, {s: globals()[f"stage_{s}"] for s in STAGES}, a, log,
                  label=f"{a.family}: ")


if __name__ == "__main__":
    main()
