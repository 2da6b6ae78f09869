"""bench/bench_common.py: the sums the end-to-end benchmarks report for a configuration."""

from __future__ import annotations

import sys

import pytest

from splitspec.launcher import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from bench_common import Totals, identical  # noqa: E402


def response(seconds: float, text: str, tokens: int, steps: int, proposed: int,
             accepted: int) -> tuple[float, str, dict]:
    return seconds, text, {"completion_tokens": tokens, "speculation": {
        "steps": steps, "proposed_tokens": proposed, "accepted_tokens": accepted}}


def test_totals_sum_a_configurations_responses():
    rows = [response(0.2, "a", 10, 4, 12, 6), response(0.9, "b", 30, 20, 40, 10)]
    t = Totals.of(rows)
    assert t.ms_per_token == pytest.approx((0.2 / 10 + 0.9 / 30) / 2 * 1000)
    assert (t.tokens, t.steps, t.proposed, t.accepted) == (40, 24, 52, 16)


def test_identical_compares_each_text_with_speculation_offs():
    off = [response(1, "a", 1, 1, 0, 0), response(1, "b", 1, 1, 0, 0)]
    assert identical([response(2, "a", 1, 1, 1, 1), response(2, "b", 1, 1, 1, 1)], off) == "yes"
    assert identical([response(2, "a", 1, 1, 1, 1), response(2, "c", 1, 1, 1, 1)], off) == "NO"
