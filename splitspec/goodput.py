"""The goodput model behind the `auto` speculation policy: pure functions, no I/O.

Goodput is output tokens per second of verifier time (SmartSpec, "Optimizing Speculative
Decoding for Serving LLMs Using Goodput"). For a draft of k tokens whose tokens are each
accepted with probability a until the first rejection (Leviathan et al.), a step emits

    E[tokens](a, k) = (1 - a^(k+1)) / (1 - a)          (k + 1 when a = 1; 1 when k = 0)

and costs the verifier's step time at the batch's token count plus the proposer's round trip
(the engine waits for drafts before it verifies). Both the gateway (per request) and the
verifier (per sequence and step) pick the (method, k), k = 0 meaning off, with the highest
goodput. docs/policy.md has the constants and a worked example.

Acceptance is estimated with the usual model's maximum-likelihood estimate: of the draft
positions that were tried (accepted tokens plus one rejected token per draft that was not
accepted in full), the share accepted, shrunk towards a prior while there is little data.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Iterable, Mapping

# The verifier's step time before any step was measured: seconds = BASE + PER_TOKEN * tokens.
DEFAULT_BASE_S = 0.010
DEFAULT_PER_TOKEN_S = 0.0005
# A bucket of step times counts once it has this many steps.
MIN_BUCKET_STEPS = 3
# Acceptance prior: optimistic, so that a method without data gets tried, and weighted as this
# many tried draft positions, so that a few drafts outweigh it.
PRIOR_ACCEPTANCE = 0.7
PRIOR_STRENGTH = 20.0
# Speculation must beat plain decoding by this share of goodput: estimates are noisy and a
# draft costs proposer capacity and KV slots that the model does not count.
SPECULATION_MARGIN = 0.03


def expected_tokens(a: float, k: int) -> float:
    """Tokens one step emits for a k-token draft with per-token acceptance a."""
    if k <= 0:
        return 1.0
    a = min(max(a, 0.0), 1.0)
    if a >= 1.0 - 1e-12:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True)
class Acceptance:
    """Draft positions tried and accepted (counts; may be decayed, hence floats)."""

    accepted: float = 0.0
    tried: float = 0.0  # accepted + one per draft with a rejection

    def rate(self, prior: float = PRIOR_ACCEPTANCE, strength: float = PRIOR_STRENGTH) -> float:
        return (self.accepted + prior * strength) / (self.tried + strength)

    def plus(self, accepted: float, tried: float) -> "Acceptance":
        return Acceptance(self.accepted + accepted, self.tried + tried)

    def scaled(self, factor: float) -> "Acceptance":
        return Acceptance(self.accepted * factor, self.tried * factor)


def tried_positions(k: int, accepted: int) -> int:
    """Positions of a k-token draft that were tried: the accepted ones, plus the first
    rejected one when not all were accepted."""
    return accepted + (1 if accepted < k else 0)


@dataclass(frozen=True)
class StepCost:
    """The verifier's step time as a function of the batch's tokens: piecewise-linear through
    measured (tokens, seconds) points, non-decreasing; flat below the first point, the last
    segment's slope beyond the last one."""

    tokens: tuple[float, ...]
    seconds: tuple[float, ...]
    tail_slope: float  # seconds per token beyond the last point

    def __call__(self, tokens: float) -> float:
        xs, ys = self.tokens, self.seconds
        if tokens <= xs[0]:
            return ys[0]
        if tokens >= xs[-1]:
            return ys[-1] + self.tail_slope * (tokens - xs[-1])
        i = bisect.bisect_right(xs, tokens)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)


def default_step_cost() -> StepCost:
    return StepCost((1.0,), (DEFAULT_BASE_S + DEFAULT_PER_TOKEN_S,), DEFAULT_PER_TOKEN_S)


def fit_step_cost(buckets: Iterable[tuple[int, float, float]],
                  min_steps: int = MIN_BUCKET_STEPS) -> StepCost:
    """StepCost from (steps, tokens_total, seconds_total) per bucket of batch sizes: one point
    per bucket with enough steps at its mean (tokens, seconds), made non-decreasing (a larger
    batch never costs less). With one point, the default per-token slope scaled to it."""
    points = sorted((t / n, s / n) for n, t, s in buckets if n >= min_steps and n > 0)
    if not points:
        return default_step_cost()
    xs: list[float] = []
    ys: list[float] = []
    for x, y in points:
        if xs and x <= xs[-1]:
            continue
        xs.append(x)
        ys.append(max(y, ys[-1]) if ys else y)
    if len(xs) == 1:
        scale = ys[0] / (DEFAULT_BASE_S + DEFAULT_PER_TOKEN_S * xs[0])
        return StepCost(tuple(xs), tuple(ys), DEFAULT_PER_TOKEN_S * scale)
    tail = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
    return StepCost(tuple(xs), tuple(ys), tail)


def batch_goodput(a: float, k: int, batch: int, cost: StepCost, round_trip_s: float) -> float:
    """Tokens per second of a batch of `batch` sequences that all draft k tokens with
    acceptance a (k = 0: plain decoding, no proposer to wait for)."""
    batch = max(batch, 1)
    if k <= 0:
        return batch / cost(batch)
    return batch * expected_tokens(a, k) / (cost(batch * (k + 1)) + round_trip_s)


def marginal_goodput(a: float, k: int, cost: StepCost, others_tokens: float,
                     others_expected: float, round_trip_s: float) -> float:
    """Tokens per second of one step when one sequence drafts k tokens and the rest of the
    batch forwards `others_tokens` and emits `others_expected` tokens. `round_trip_s` is what
    this sequence's draft adds to the step's wait (0 when its proposer is asked anyway)."""
    wait = round_trip_s if k > 0 else 0.0
    return (others_expected + expected_tokens(a, k)) / (cost(others_tokens + 1 + k) + wait)


@dataclass(frozen=True)
class Choice:
    method: str | None  # None: off
    k: int
    goodput: float  # tokens/s the model expects
    reason: str  # goodput | low_acceptance | compute_bound


def best_k(a: float, batch: int, cost: StepCost, round_trip_s: float, k_max: int,
           k_min: int = 1) -> tuple[int, float]:
    """The k in [k_min, k_max] (k_min >= 1) with the highest batch goodput, and that goodput;
    ties go to the smaller k."""
    best = (k_min, batch_goodput(a, k_min, batch, cost, round_trip_s))
    for k in range(k_min + 1, k_max + 1):
        g = batch_goodput(a, k, batch, cost, round_trip_s)
        if g > best[1] * (1 + 1e-9):
            best = (k, g)
    return best


def choose(acceptance: Mapping[str, float], round_trip_s: Mapping[str, float], batch: int,
           cost: StepCost, k_max: int, allow_off: bool = True,
           margin: float = SPECULATION_MARGIN) -> Choice:
    """The (method, k) with the highest goodput for a batch of `batch` sequences, or off when
    no method beats plain decoding by `margin` (never off when allow_off is False).

    Why off: `low_acceptance` when the best method would not pay even in a batch of one (the
    cheapest case for speculation), else `compute_bound` (the batch makes drafts too dear)."""
    off = batch_goodput(0.0, 0, batch, cost, 0.0)
    best: Choice | None = None
    for method in sorted(acceptance):
        k, g = best_k(acceptance[method], batch, cost, round_trip_s.get(method, 0.0), k_max)
        if best is None or g > best.goodput * (1 + 1e-9):
            best = Choice(method, k, g, "goodput")
    if best is None:
        return Choice(None, 0, off, "no_proposer")
    if not allow_off or best.goodput > off * (1 + margin):
        return best
    a = acceptance[best.method]
    _, alone = best_k(a, 1, cost, round_trip_s.get(best.method, 0.0), k_max)
    pays_alone = alone > batch_goodput(0.0, 0, 1, cost, 0.0) * (1 + margin)
    return Choice(None, 0, off, "compute_bound" if pays_alone else "low_acceptance")


def decay_factor(new_tried: float, half_life: float) -> float:
    """Weight left on old counts after `new_tried` more positions, halving every half_life."""
    if half_life <= 0 or not math.isfinite(half_life):
        return 1.0
    return 0.5 ** (max(new_tried, 0.0) / half_life)
