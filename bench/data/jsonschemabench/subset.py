"""The JSONSchemaBench subset kept here (README.md): from the benchmark's test cases
(maskbench/data/<set>---<name>.json in github.com/guidance-ai/jsonschemabench), per set in
SETS, the first files by name whose JSON is at most MAX_BYTES bytes and whose tests hold at
least one valid and one invalid instance; each file's content kept unchanged, one per line of
schemas.jsonl with its set and name.

    python bench/data/jsonschemabench/subset.py PATH/TO/maskbench/data           # write
    python bench/data/jsonschemabench/subset.py PATH/TO/maskbench/data --check   # compare
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SETS = {"Glaiveai2K": 17, "Github_easy": 17, "Github_medium": 16}
MAX_BYTES = 4000
OUT = Path(__file__).with_name("schemas.jsonl")


def select(data: Path) -> list[str]:
    lines = []
    for name, count in SETS.items():
        kept = 0
        for path in sorted(data.glob(f"{name}---*.json")):
            raw = path.read_bytes()
            if len(raw) > MAX_BYTES:
                continue
            case = json.loads(raw)
            valid = {t["valid"] for t in case.get("tests", [])}
            if valid != {True, False}:
                continue
            lines.append(json.dumps({"set": name, "name": path.name.split("---", 1)[1],
                                     **case}, ensure_ascii=False, sort_keys=False))
            kept += 1
            if kept == count:
                break
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="the benchmark's maskbench/data directory")
    ap.add_argument("--check", action="store_true", help="compare with schemas.jsonl")
    args = ap.parse_args()
    text = "".join(line + "\n" for line in select(args.data))
    if args.check:
        same = OUT.read_text() == text
        print("schemas.jsonl matches" if same else "schemas.jsonl differs")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {len(text.splitlines())} schemas to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
