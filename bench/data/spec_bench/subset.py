"""Reproduces question.jsonl (next to this file) from Spec-Bench's own question set.

    python bench/data/spec_bench/subset.py PATH/TO/Spec-Bench/data/spec_bench/question.jsonl
    python bench/data/spec_bench/subset.py PATH --check   # exit 1 unless the committed file matches

Keeps the questions whose question_id is divisible by 4 (120 of 480: 20 per group), each line
as it is in the source, in the source's order. The other 360 are left out on purpose, so that
results can be checked on questions nobody tuned on. README.md says where the source is from.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP_EVERY = 4


def subset(lines: list[str]) -> list[str]:
    """The source's lines whose question_id is divisible by KEEP_EVERY, unchanged."""
    return [line for line in lines
            if line.strip() and json.loads(line)["question_id"] % KEEP_EVERY == 0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="Spec-Bench's data/spec_bench/question.jsonl")
    ap.add_argument("--out", default=str(HERE / "question.jsonl"))
    ap.add_argument("--check", action="store_true",
                    help="compare with --out instead of writing it")
    args = ap.parse_args()
    raw = Path(args.source).read_bytes()
    print(f"source sha256 {hashlib.sha256(raw).hexdigest()}, "
          f"{len(raw.decode().splitlines())} lines")
    kept = "".join(line + "\n" for line in subset(raw.decode().splitlines()))
    if args.check:
        same = Path(args.out).read_text() == kept
        print(f"{args.out}: {'identical' if same else 'DIFFERS'}")
        return 0 if same else 1
    Path(args.out).write_text(kept)
    print(f"wrote {len(kept.splitlines())} questions to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
