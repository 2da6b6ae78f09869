"""The goodput model: expected tokens per step, the fitted step cost, and the choice of
(method, k) on synthetic numbers."""

from __future__ import annotations

import pytest

from splitspec.goodput import (
    Acceptance,
    StepCost,
    batch_goodput,
    choose,
    decay_factor,
    expected_tokens,
    fit_step_cost,
    marginal_goodput,
    tried_positions,
)

# Memory-bound at small batches (flat), compute-bound beyond 16 tokens.
FLAT_THEN_STEEP = StepCost((1.0, 16.0, 64.0), (0.010, 0.012, 0.060), 0.001)


def test_expected_tokens_follows_the_geometric_series():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0


def test_tried_positions_count_the_first_rejection():
    assert tried_positions(4, 4) == 4  # all accepted: nothing rejected
    assert tried_positions(4, 1) == 2
    assert tried_positions(4, 0) == 1


def test_acceptance_rate_starts_at_the_prior_and_follows_the_data():
    assert Acceptance().rate(0.7, 20) == pytest.approx(0.7)
    assert Acceptance(90, 1000).rate(0.7, 20) == pytest.approx((90 + 14) / 1020)
    assert Acceptance(10, 20).scaled(0.5) == Acceptance(5, 10)
    assert decay_factor(2000, 2000) == pytest.approx(0.5)


def test_step_cost_interpolates_and_never_decreases():
    # buckets: (steps, tokens total, seconds total)
    cost = fit_step_cost([(10, 10, 0.1), (10, 80, 0.12), (10, 640, 0.5), (10, 160, 0.11),
                          (1, 5000, 9.0)])  # the last has too few steps to count
    assert cost.tokens == (1.0, 8.0, 16.0, 64.0)
    assert cost.seconds == (0.01, 0.012, 0.012, 0.05)  # 16 tokens cannot be cheaper than 8
    assert cost(4.5) == pytest.approx(0.011)
    assert cost(0.5) == 0.01
    assert cost(128) == pytest.approx(0.05 + 64 * (0.05 - 0.012) / 48)


def test_step_cost_without_data_uses_the_default_and_one_point_scales_it():
    assert fit_step_cost([])(1) > 0
    one = fit_step_cost([(5, 5, 0.1)])
    assert one(1) == pytest.approx(0.02) and one(101) > one(1)


def test_high_acceptance_speculates_with_a_larger_k_than_moderate_acceptance():
    high = choose({"mlp": 0.9}, {"mlp": 0.001}, 1, FLAT_THEN_STEEP, 8)
    moderate = choose({"mlp": 0.5}, {"mlp": 0.001}, 1, FLAT_THEN_STEEP, 8)
    assert high.method == moderate.method == "mlp"
    assert high.reason == moderate.reason == "goodput"
    assert high.k > moderate.k >= 1


def test_low_acceptance_picks_off():
    c = choose({"ngram": 0.05}, {"ngram": 0.002}, 1, FLAT_THEN_STEEP, 8)
    assert (c.method, c.k, c.reason) == (None, 0, "low_acceptance")


def test_a_compute_bound_batch_picks_off_although_the_method_pays_alone():
    assert choose({"mlp": 0.6}, {"mlp": 0.001}, 1, FLAT_THEN_STEEP, 8).method == "mlp"
    c = choose({"mlp": 0.6}, {"mlp": 0.001}, 16, FLAT_THEN_STEEP, 8)
    assert (c.method, c.k, c.reason) == (None, 0, "compute_bound")


def test_the_best_method_wins_and_off_is_not_allowed_when_on_was_asked_for():
    c = choose({"ngram": 0.3, "mlp": 0.8}, {"ngram": 0.0, "mlp": 0.001}, 1, FLAT_THEN_STEEP, 8)
    assert c.method == "mlp"
    forced = choose({"ngram": 0.05}, {}, 16, FLAT_THEN_STEEP, 8, allow_off=False)
    assert forced.method == "ngram" and forced.k >= 1


def test_a_long_round_trip_makes_speculation_lose():
    assert choose({"draft": 0.6}, {"draft": 0.5}, 1, FLAT_THEN_STEEP, 8).method is None


def test_marginal_goodput_of_one_sequence_in_a_batch():
    # alone: its own tokens over its own step; in a batch the others' tokens share the step
    assert marginal_goodput(0.5, 0, FLAT_THEN_STEEP, 0, 0, 0.0) == pytest.approx(100.0)
    assert marginal_goodput(0.5, 1, FLAT_THEN_STEEP, 15, 15, 0.0) == pytest.approx(
        16.5 / FLAT_THEN_STEEP(17))
    assert batch_goodput(0.5, 0, 16, FLAT_THEN_STEEP, 0.0) == pytest.approx(16 / 0.012)
