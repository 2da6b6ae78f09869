"""Which vocabulary subset a drafter's output head scores (kernels/vocab_subset.py): the learned
proposers' (`--vocab-subset`) and an EAGLE-1/2 head's, which scores with the target's output
head (the verifier's `--eagle-vocab-subset`).

A drafter's directory may carry `token_frequencies.json`: token ids ranked by how often the
target itself says them (counted on the target's own answers), and the subset size that was
measured to pay off. The setting picks the head:

  auto  the file's `recommended_subset` when the file has one, else the whole vocabulary
  0     the whole vocabulary
  N     the N most frequent tokens of the file (the file must exist)
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import torch

from kernels.vocab_subset import subset_ids

FREQUENCIES = "token_frequencies.json"

log = logging.getLogger(__name__)


def parse_setting(setting: str, flag: str = "--vocab-subset") -> int | None:
    """'auto' -> None; '0' -> 0; 'N' -> N (ValueError naming `flag` otherwise)."""
    if setting == "auto":
        return None
    try:
        n = int(setting)
    except ValueError:
        raise ValueError(f"{flag} must be auto or a token count, not {setting!r}") from None
    if n < 0:
        raise ValueError(f"{flag} must be auto or >= 0, not {n}")
    return n


def resolve_subset(model_dir: str | Path, setting: str, vocab_size: int,
                   flag: str = "--vocab-subset") -> torch.Tensor | None:
    """The sorted token ids the head scores, or None for the whole vocabulary."""
    n = parse_setting(setting, flag)
    path = Path(model_dir) / FREQUENCIES
    if n == 0 or (n is None and not path.exists()):
        return None
    if not path.exists():
        raise ValueError(f"{flag} {n} needs {path} (token ids ranked by frequency)")
    try:
        data = json.loads(path.read_text())
        ranked = [int(t) for t in data["ranked_ids"]]
        if n is None:
            n = int(data.get("recommended_subset") or 0)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} is malformed: {exc}") from None
    if not n or n >= vocab_size:
        return None
    ids = subset_ids(ranked, n, vocab_size)
    log.info("output head scores the %d most frequent of %d tokens (%s)", n, vocab_size, path)
    return ids


def write_frequencies(path: str | Path, counts: Counter, source: str,
                      recommended_subset: int | None = None, **extra) -> None:
    """Write the file `resolve_subset` reads: ids ranked by count (ties by id), with counts."""
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    data = {"source": source, "counted_tokens": sum(counts.values()),
            "recommended_subset": recommended_subset, **extra,
            "ranked_ids": ranked, "counts": [counts[t] for t in ranked]}
    Path(path).write_text(json.dumps(data) + "\n")
