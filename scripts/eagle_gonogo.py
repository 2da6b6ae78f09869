"""Go/no-go of a newly trained EAGLE head against the shipped one, on the independent held-out
answers (scripts/eagle_heldout.py's prompts answered by the target, runs/eagle-real/val/).

    python scripts/eagle_gonogo.py --candidate runs/eagle-real/candidate [--replace]

Both heads are measured on the same answers: greedy chain acceptance per position (exact, from
the training-time test's forward, scripts/eagle_ttt.py) and tokens per step of chains of 1..k
(greedy decoding simulated along the answer). The candidate wins when, on chat and on code, both
its first-position acceptance and its mean accepted drafts per step at its best chain length are
higher than the shipped head's. With --replace a winner's files replace the shipped head's and
`train_eagle.py --stages eval` rewrites its eval.json and README.md. The comparison is written to
data/eagle-real/gonogo.json either way.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import eagle_data as ed  # noqa: E402
import eagle_fit  # noqa: E402

from verifier_service.methods.eagle.head import EagleHead  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def measure(head: EagleHead, val: list[dict], k: int) -> dict:
    out = {}
    for kind, recs in eagle_fit._kinds(val).items():
        acc = eagle_fit.chain_acceptance(head, recs, k)
        tps = eagle_fit.chain_tokens_per_step(head, recs, k)
        best = max(range(k), key=lambda i: tps[i])
        out[kind] = {"answers": len(recs), "first_position_acceptance": acc[0],
                     "chain_acceptance_per_position": acc, "chain_tokens_per_step": tps,
                     "best_chain_length": best + 1,
                     "mean_accepted_per_step": tps[best] - 1.0}
    return out


def verdict(shipped: dict, candidate: dict) -> bool:
    """Whether the candidate beats the shipped head on every kind, on both measures."""
    return all(candidate[k]["first_position_acceptance"] > shipped[k]["first_position_acceptance"]
               and candidate[k]["mean_accepted_per_step"] > shipped[k]["mean_accepted_per_step"]
               for k in shipped if k != "training")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=Path, default=REPO / "models/smollm2-135m-instruct")
    p.add_argument("--shipped", type=Path, default=REPO / "models/smollm2-135m-instruct-eagle")
    p.add_argument("--candidate", type=Path, required=True)
    p.add_argument("--work", type=Path, default=REPO / "runs/eagle-real")
    p.add_argument("--out", type=Path, default=REPO / "data/eagle-real/gonogo.json")
    p.add_argument("--k", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--replace", action="store_true")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    _, target = eagle_fit.target_tensors(a)
    val = ed.load_records(a.work / "val")
    res = {"heldout_answers": len(val), "k": a.k, "time": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                        time.gmtime())}
    for name, d in (("shipped", a.shipped), ("candidate", a.candidate)):
        res[name] = measure(EagleHead.from_dir(d, target["embed"]), val, a.k)
        tj = d / "training.json"
        if tj.exists():
            t = json.loads(tj.read_text())
            res[name]["training"] = {k: t.get(k) for k in ("steps", "train_minutes",
                                                           "answer_tokens_seen", "train_answers",
                                                           "lr", "mix", "init")}
        print(name, json.dumps({k: (v["first_position_acceptance"], v["mean_accepted_per_step"])
                                for k, v in res[name].items() if k != "training"}), flush=True)
    res["candidate_wins"] = verdict(res["shipped"], res["candidate"])
    res["replaced"] = bool(a.replace and res["candidate_wins"])
    if res["replaced"]:
        for f in ("config.json", "model.safetensors", "training.json"):
            shutil.copy2(a.candidate / f, a.shipped / f)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"candidate wins: {res['candidate_wins']}; replaced: {res['replaced']}")
    if res["replaced"]:  # the new head's eval.json and README.md
        import train_eagle

        train_eagle.main(["--family", "real", "--stages", "eval", "--work", str(a.work),
                          "--out", str(a.shipped), "--threads", str(a.threads)])


if __name__ == "__main__":
    main()
