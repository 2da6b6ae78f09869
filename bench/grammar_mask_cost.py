"""The grammar mask's own cost per step, for bench/structured_bench.py.

What a structured request adds to a step of speculation off, measured apart from the step: the
host fill (one int32 bitmask for the step's rows, each structured row written by its request's
matcher, verifier_service/step/sampling_state.py) and the apply (the bitmask unpacked to the
banned tokens, kernels/token_bitmask.py, and the logits masked with -inf, as
kernels/logits_processors.py does). The matchers are the bench's own compiled grammars, each
advanced through the first half of an output the engine generated for it (a state inside the
structure, as a running request's is). Median over repetitions, after a warm-up, with the
torch threads asked for (the apply's few large element-wise operations run on torch's intra-op
pool: on a machine whose cores other processes hold, each waits for its slowest thread).
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch

from kernels.token_bitmask import banned_from_bitmask
from verifier_service.grammar.matcher import GrammarState

__all__ = ["mask_seconds"]


def _states(grammars: Sequence, outputs: Sequence[Sequence[int]], vocab: int,
            batch: int) -> list[GrammarState]:
    states = []
    for i in range(batch):
        state = GrammarState(grammars[i % len(grammars)], vocab)
        out = outputs[i % len(outputs)]
        if not state.accept(out[:len(out) // 2]):
            raise ValueError(f"output {i % len(outputs)} does not follow its grammar")
        states.append(state)
    return states


def mask_seconds(grammars: Sequence, outputs: Sequence[Sequence[int]], vocab: int, batch: int,
                 reps: int = 50, warmup: int = 5, threads: int = 0) -> tuple[float, float]:
    """(fill, apply) seconds of one step of `batch` structured rows (one per sequence, as off
    verifies them): medians over `reps`, on `threads` torch threads (0: as set)."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _timed(_states(grammars, outputs, vocab, batch), vocab, reps, warmup)
    finally:
        torch.set_num_threads(before)


def _timed(states: list[GrammarState], vocab: int, reps: int, warmup: int
           ) -> tuple[float, float]:
    batch = len(states)
    words = (vocab + 31) // 32
    logits = torch.randn(batch, vocab)
    fills, applies = [], []
    for rep in range(warmup + reps):
        start = time.perf_counter()
        bitmask = torch.full((batch, words), -1, dtype=torch.int32)
        for row, state in enumerate(states):
            state.fill_rows((), (), bitmask, row)
        filled = time.perf_counter()
        masked = logits.masked_fill(banned_from_bitmask(bitmask, vocab), float("-inf"))
        done = time.perf_counter()
        if not torch.isfinite(masked).any(dim=1).all():
            raise AssertionError("a row with no allowed token")
        if rep >= warmup:
            fills.append(filled - start)
            applies.append(done - filled)
    return statistics.median(fills), statistics.median(applies)
