"""The goodput model: expected tokens per step, the fitted step cost, and the choice of
(method, k) on synthetic numbers."""

from __future__ import annotations

import planted_bugs as bug
import pytest

from splitspec.goodput import (
    Acceptance,
    MethodCounts,
    MethodModel,
    RoundTrip,
    StepCost,
    batch_goodput,
    best_k,
    choose,
    decay_factor,
    draft_limit,
    expected_tokens,
    fit_round_trip,
    fit_step_cost,
    fit_step_costs,
    marginal_goodput,
    seqs_class,
    shift_odds,
    tried_positions,
)

# Memory-bound at small batches (flat), compute-bound beyond 16 tokens.
FLAT_THEN_STEEP = StepCost((1.0, 16.0, 64.0), (0.010, 0.012, 0.060), 0.001)
FAST = RoundTrip(0.001, 0.0)


def m(a: float, hit: float = 1.0, rt: RoundTrip = FAST) -> MethodModel:
    return MethodModel(a, hit, rt)


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
    assert Acceptance(10, 20, 4, 8).scaled(0.5) == Acceptance(5, 10, 2, 4)
    assert Acceptance(10, 20, 4, 8).minus(Acceptance(4, 30, 1, 2)) == Acceptance(6, 0, 3, 6)
    assert Acceptance(drafts=2, asked=10).hit_rate(1.0, 10) == pytest.approx(0.6)
    assert decay_factor(2000, 2000) == pytest.approx(0.5)


def test_step_cost_interpolates_and_never_decreases():
    # buckets: (steps, tokens total, seconds total)
    cost = fit_step_cost([(10, 10, 0.1), (10, 80, 0.12), (10, 640, 0.5), (10, 160, 0.11),
                          (1, 5000, 9.0)])  # the last has too few steps to count
    assert cost.tokens == (1.0, 8.0, 16.0, 64.0)
    # 16 tokens cannot be cheaper than 8: both get their weighted mean
    assert cost.seconds == pytest.approx((0.01, 0.0115, 0.0115, 0.05))
    assert cost(4.5) == pytest.approx(0.01075)
    assert cost(0.5) == 0.01
    assert cost(128) == pytest.approx(0.05 + 64 * (0.05 - 0.0115) / 48)
    # one slow bucket among many steps does not lift everything after it
    noisy = fit_step_cost([(100, 100, 1.0), (3, 12, 0.3), (100, 800, 1.2), (100, 3200, 2.0)])
    assert noisy(8) < 0.02 and noisy(32) == pytest.approx(0.02)


def test_each_kind_of_step_has_its_own_cost_and_a_kind_without_data_the_pooled_one():
    greedy = [("greedy", 10, 10, 0.10), ("greedy", 10, 60, 0.12)]
    tree = [("tree", 10, 60, 0.30)]  # a tree step of 6 rows: the tree sampler's cost too
    costs = fit_step_costs(greedy + tree)
    assert costs.of("tree")(6) == pytest.approx(0.03)
    assert costs.of("greedy")(6) == pytest.approx(0.012)
    pooled = costs.of("sampled")  # no sampled steps: every step on one curve
    assert costs.of("greedy")(6) < pooled(6) <= costs.of("tree")(6)
    assert fit_step_costs([]).of("tree")(1) == fit_step_cost([])(1)


# every step on one curve by batch tokens: 16 one-token sequences cost 30 ms (each sequence's
# attention and bookkeeping), a step of ~20 tokens from 4 sequences 17 ms, 64 tokens 90 ms
BY_TOKENS = [("greedy", 50, 50, 0.4), ("greedy", 50, 1000, 0.85), ("greedy", 50, 800, 1.5),
             ("greedy", 50, 3200, 4.5)]
# the steps of 9-16 sequences alone: 16 tokens 30 ms, 40 tokens 34 ms (their rows are cheap)
SIXTEEN = [("greedy", 16, 50, 800, 1.5), ("greedy", 16, 20, 800, 0.68)]


def check_a_class_of_sequence_counts_has_its_own_curve() -> None:
    """Steps of 9-16 sequences read their own curve over the tokens they were measured at,
    and beyond them the kind's curve moved to meet it; other batches (or none given) the
    curve by tokens alone; at 16 a method that pays there is chosen."""
    costs = fit_step_costs(BY_TOKENS, by_seqs=SIXTEEN)
    sixteen, by_tokens = costs.of("greedy", 16), costs.of("greedy")
    assert sixteen(16) == pytest.approx(0.03) and sixteen(40) == pytest.approx(0.034)
    assert sixteen(64) == pytest.approx(0.034 + by_tokens(64) - by_tokens(40))
    assert costs.of("greedy", 9) is sixteen and costs.of("greedy", 17) is by_tokens
    assert costs.of("greedy", 4) is by_tokens and costs.of("tree", 16) is costs.of("tree")
    model = MethodModel(0.7)  # k = 2: 3 rows, 2.19 tokens a sequence
    assert choose({"m": model}, 16, by_tokens, 2).method is None  # priced by tokens: off
    assert choose({"m": model}, 16, sixteen, 2).method == "m"


def test_a_class_of_sequence_counts_has_its_own_curve():
    check_a_class_of_sequence_counts_has_its_own_curve()
    assert [seqs_class(n) for n in (0, 1, 2, 3, 4, 5, 16, 17)] == [1, 1, 2, 4, 4, 8, 16, 32]
    thin = fit_step_costs(BY_TOKENS, by_seqs=[("greedy", 16, 2, 32, 0.06)])  # too few steps
    assert thin.of("greedy", 16) is thin.of("greedy")


def test_costs_that_ignore_the_batchs_sequences_fail_the_class_check(monkeypatch):
    bug.step_cost_class_ignores_the_sequences(monkeypatch)
    with pytest.raises(AssertionError):
        check_a_class_of_sequence_counts_has_its_own_curve()


def check_a_class_of_sequence_counts_has_its_own_round_trip() -> None:
    """A head in the verifier measured alone (10 ms a sequence) and among 16 (1 ms each:
    drafted together) is priced at each batch's own share; a class with too few answers, or
    no batch given, reads every answer; at 16 the head that pays there is chosen."""
    counts = MethodCounts(round_trips=((3, 42.0, 0.23),), round_trips_by_seqs=(
        (3, 1, 20.0, 0.2), (3, 16, 20.0, 0.02), (3, 8, 2.0, 0.01)))
    alone, sixteen = counts.round_trip(True, 1), counts.round_trip(True, 12)
    assert alone(3) == pytest.approx(0.010) and sixteen(3) == pytest.approx(0.001)
    assert alone.per_sequence and sixteen.per_sequence
    every = counts.round_trip(True)(3)
    assert every == pytest.approx(0.23 / 42) and counts.round_trip(True, 5)(3) == every
    cost = StepCost((16.0, 64.0), (0.030, 0.034), 0.0)
    assert choose({"eagle": MethodModel(0.7, 1.0, sixteen)}, 16, cost, 3).method == "eagle"
    assert choose({"eagle": MethodModel(0.7, 1.0, counts.round_trip(True))}, 16, cost,
                  3).method is None


def test_a_class_of_sequence_counts_has_its_own_round_trip():
    check_a_class_of_sequence_counts_has_its_own_round_trip()


def test_round_trips_that_ignore_the_batch_fail_the_class_check(monkeypatch):
    bug.round_trip_class_ignored(monkeypatch)
    with pytest.raises(AssertionError):
        check_a_class_of_sequence_counts_has_its_own_round_trip()


def test_a_method_priced_at_its_own_kind_of_step():
    """A tree of a method that pays as a chain may not pay at the tree's own step cost."""
    model = MethodModel(0.6)
    cheap = StepCost((1.0, 9.0), (0.010, 0.011), 0.0)
    dear = StepCost((1.0, 9.0), (0.010, 0.040), 0.0)
    assert choose({"m": model}, 1, cheap, 8).method == "m"
    assert choose({"m": model}, 1, cheap, 8, costs={"m": dear}).method is None


def test_step_cost_without_data_uses_the_default_and_one_point_scales_it():
    assert fit_step_cost([])(1) > 0
    one = fit_step_cost([(5, 5, 0.1)])
    assert one(1) == pytest.approx(0.02) and one(101) > one(1)


def test_high_acceptance_speculates_with_a_larger_k_than_moderate_acceptance():
    high = choose({"mlp": m(0.9)}, 1, FLAT_THEN_STEEP, 8)
    moderate = choose({"mlp": m(0.5)}, 1, FLAT_THEN_STEEP, 8)
    assert high.method == moderate.method == "mlp"
    assert high.reason == moderate.reason == "goodput"
    assert high.k > moderate.k >= 1


def test_low_acceptance_picks_off():
    c = choose({"ngram": m(0.05)}, 1, FLAT_THEN_STEEP, 8)
    assert (c.method, c.k, c.reason) == (None, 0, "low_acceptance")
    # a high acceptance when drafts are rare is low acceptance per step asked
    slow = RoundTrip(0.003)
    assert choose({"ngram": m(0.8, 0.05, slow)}, 1, FLAT_THEN_STEEP, 8).method is None
    assert choose({"ngram": m(0.8, 0.9, slow)}, 1, FLAT_THEN_STEEP, 8).method == "ngram"


def test_a_compute_bound_batch_picks_off_although_the_method_pays_alone():
    assert choose({"mlp": m(0.6)}, 1, FLAT_THEN_STEEP, 8).method == "mlp"
    c = choose({"mlp": m(0.6)}, 16, FLAT_THEN_STEEP, 8)
    assert (c.method, c.k, c.reason) == (None, 0, "compute_bound")


def test_the_best_method_wins_and_off_is_not_allowed_when_on_was_asked_for():
    c = choose({"ngram": m(0.3), "mlp": m(0.8)}, 1, FLAT_THEN_STEEP, 8)
    assert c.method == "mlp"
    forced = choose({"ngram": m(0.05)}, 16, FLAT_THEN_STEEP, 8, allow_off=False)
    assert forced.method == "ngram" and forced.k >= 1


def test_a_long_round_trip_makes_speculation_lose():
    assert choose({"draft": m(0.6, rt=RoundTrip(0.5))}, 1, FLAT_THEN_STEEP, 8).method is None


def test_a_round_trip_growing_with_k_keeps_k_small():
    flat = choose({"draft": m(0.8)}, 1, FLAT_THEN_STEEP, 8)
    growing = choose({"draft": m(0.8, rt=RoundTrip(0.001, 0.004))}, 1, FLAT_THEN_STEEP, 8)
    assert flat.k > growing.k >= 1


def test_a_proposer_with_its_own_draft_limit_is_not_asked_for_more():
    assert choose({"mlp": m(0.95)}, 1, FLAT_THEN_STEEP, 8).k == 8
    capped = MethodModel(0.95, 1.0, RoundTrip(0.001, 0.0001), max_draft=5)
    assert capped.expected(8) == capped.expected(5) and capped.tokens(8) == 6
    assert choose({"mlp": capped}, 1, FLAT_THEN_STEEP, 8).k == 5
    assert draft_limit(5, 8, 20) == 5
    assert draft_limit(5, 8, 19) == 0  # too few drafts to tell
    assert draft_limit(5, 5, 100) == 0  # never asked for more than it drafted


# Memory-bound for longer, as on a CPU with packed weights: rows are cheap up to 64 batch tokens.
CONCAVE = StepCost((1.0, 16.0, 32.0, 64.0, 128.0), (0.010, 0.012, 0.014, 0.020, 0.045), 0.0004)
# A suffix-style proposer, 1000 asks for 5 tokens: it drafts one token 90 % of the time, but a
# second only where its match is long, and those long drafts are confident ones.
SUFFIX_LIKE = Acceptance(asked_at=(1000,) * 5, drafted_at=(900, 300, 150, 100, 80),
                         accepted_at=(500, 200, 120, 90, 75))


def test_without_measured_positions_the_model_is_the_geometric_one():
    model = MethodModel(0.8, 0.5, max_draft=4)
    assert model.tokens(3) == pytest.approx(1 + 0.5 * 3)
    assert model.expected(3) == pytest.approx(1 + 0.5 * (expected_tokens(0.8, 3) - 1))
    assert model.tokens(8) == pytest.approx(1 + 0.5 * 4)


def test_positions_are_the_measured_shares_shrunk_towards_the_geometric_model():
    acc = Acceptance(asked_at=(100, 30), drafted_at=(40, 6), accepted_at=(20, 3))
    (r1, g1), (r2, g2) = acc.positions(0.5, 0.8, strength=10)
    assert (r1, g1) == (pytest.approx((40 + 8) / 110), pytest.approx((20 + 0.8 * 0.5 * 10) / 110))
    assert (r2, g2) == (pytest.approx((6 + 8) / 40), pytest.approx((3 + 0.8 * 0.25 * 10) / 40))
    assert Acceptance().positions(0.5, 0.8) == ()
    # counts add, subtract and decay position by position
    both = acc.plus(Acceptance(asked_at=(10,), drafted_at=(2,), accepted_at=(1,)))
    assert (both.asked_at, both.drafted_at, both.accepted_at) == ((110, 30), (42, 6), (21, 3))
    assert both.minus(acc) == Acceptance(asked_at=(10, 0), drafted_at=(2, 0), accepted_at=(1, 0))
    assert acc.scaled(0.5).asked_at == (50, 15)


def test_measured_positions_give_the_rows_and_tokens_of_a_step():
    pos = SUFFIX_LIKE.positions(0.55, 0.9)
    model = MethodModel(0.55, 0.9, positions=pos)
    assert model.tokens(5) == pytest.approx(1 + sum(r for r, _ in pos))
    assert model.tokens(5) == pytest.approx(1 + 1.53, abs=0.05)  # not 1 + 0.9 * 5
    assert model.expected(5) == pytest.approx(1 + 0.975, abs=0.05)
    # beyond the measured positions: the last one's rows, its gain times the acceptance
    assert model.per_position(6)[5] == pytest.approx((pos[4][0], pos[4][1] * 0.55))


def test_a_proposer_that_rarely_drafts_long_is_asked_for_more_in_a_large_batch():
    """Pricing every asked token as a forwarded row (the geometric model) makes a large k look
    dear in a batch of 16; the measured positions show most drafts stop early and the long ones
    are accepted, so the measured model asks for more and expects more of it."""
    rt = RoundTrip(0.0005)
    naive = choose({"suffix": MethodModel(0.55, 0.9, rt)}, 16, CONCAVE, 8)
    measured = choose({"suffix": MethodModel(0.55, 0.9, rt,
                                             positions=SUFFIX_LIKE.positions(0.55, 0.9))},
                      16, CONCAVE, 8)
    assert naive.method == measured.method == "suffix"
    assert naive.k <= 2 and measured.k >= 4 and measured.goodput > naive.goodput


def test_a_requests_own_rates_scale_its_methods_positions():
    method = MethodModel(0.5, 0.8, positions=((0.8, 0.4), (0.4, 0.1)))
    mine = method.for_request(acceptance=0.25, hit_rate=0.4)
    assert (mine.acceptance, mine.hit_rate) == (0.25, 0.4)
    assert mine.positions == (pytest.approx((0.4, 0.1)), pytest.approx((0.2, 0.0125)))
    # a better request never gains more at a position than it forwards there
    assert all(g <= r for r, g in method.for_request(1.0, 1.0).positions)


def check_request_gains_fall_with_depth() -> None:
    """Accepting position j + 1 takes accepting position j, so a request's gain falls with
    depth, also when it accepts more than its method and the method's deep positions are
    confident ones (n-gram and suffix drafts: a long match goes on being right)."""
    confident = tuple((1.0, 0.6 * 0.9 ** j) for j in range(8))  # 0.6, then 0.9 given the last
    method = MethodModel(0.65, 1.0, positions=confident)
    mine = method.for_request(acceptance=0.75, hit_rate=1.0)
    gains = [g for _, g in mine.positions]
    assert all(deeper < g for g, deeper in zip(gains, gains[1:])), gains
    # and it is priced as the better request it is, at every position
    assert all(m > t for (_, m), (_, t) in zip(mine.positions, method.positions))
    # a worse one as the worse
    worse = method.for_request(acceptance=0.5, hit_rate=1.0)
    assert all(w < t for (_, w), (_, t) in zip(worse.positions, method.positions))


def test_a_request_better_than_its_method_gains_less_at_each_deeper_position():
    check_request_gains_fall_with_depth()


def test_the_depth_check_catches_gains_scaled_by_a_power_of_the_ratio(monkeypatch):
    """(0.75 / 0.65)^8 = 3.1: the old scaling priced the 8th token as likelier than the 1st."""
    bug.request_scales_gains_by_a_power(monkeypatch)
    with pytest.raises(AssertionError):
        check_request_gains_fall_with_depth()


def test_shift_odds():
    assert shift_odds(0.9, 0.65, 0.65) == pytest.approx(0.9)
    assert shift_odds(0.65, 0.65, 0.75) == pytest.approx(0.75)
    assert shift_odds(0.9, 0.65, 1.0) == 1.0 and shift_odds(0.9, 0.65, 0.0) == 0.0
    assert shift_odds(1.2, 0.65, 0.3) == 1.2  # a share above 1 is left as it is
    assert 0.9 < shift_odds(0.9, 0.65, 0.75) < 1.0


# On a CPU the matrix kernels work in tiles of 6 rows: up to 6 rows cost about one, 7 a lot more.
TILES_OF_6 = StepCost((1.0, 6.0, 7.0, 9.0), (0.012, 0.0125, 0.016, 0.0165), 0.0005)


def check_all_or_nothing_drafts_are_priced_by_their_rows() -> None:
    """Prompt lookup drafts all it is asked for or nothing (here 64% / 36% of steps). Asked for
    8 it forwards 9 rows or 1, never its mean of 6: its step costs what 9 rows cost on 64% of
    the steps, and the k that fills the tile (5: 6 rows) is the one that pays."""
    lookup = MethodModel(0.6, 0.64, FAST,
                         positions=tuple((0.64, 0.64 * 0.45 * 0.8 ** j) for j in range(8)))
    seconds = lookup.step_seconds(8, TILES_OF_6)
    assert seconds[0] == TILES_OF_6(1)
    assert seconds[5] == pytest.approx(0.36 * TILES_OF_6(1) + 0.64 * TILES_OF_6(6))
    assert seconds[8] == pytest.approx(0.36 * TILES_OF_6(1) + 0.64 * TILES_OF_6(9))
    assert best_k(lookup, 1, TILES_OF_6, 8)[0] == 5
    per_k = [marginal_goodput(lookup, k, TILES_OF_6, 0.0, 0.0, FAST(k)) for k in range(9)]
    assert max(range(9), key=per_k.__getitem__) == 5


def test_all_or_nothing_drafts_are_priced_by_their_rows():
    check_all_or_nothing_drafts_are_priced_by_their_rows()


def test_the_rows_check_catches_steps_priced_at_their_mean_rows(monkeypatch):
    bug.step_priced_at_mean_rows(monkeypatch)
    with pytest.raises(AssertionError):
        check_all_or_nothing_drafts_are_priced_by_their_rows()


def test_round_trip_fit():
    rt = fit_round_trip([(2, 10, 10 * 0.003), (4, 10, 10 * 0.005), (6, 10, 10 * 0.007)])
    assert (rt.base_s, rt.per_token_s) == (pytest.approx(0.001), pytest.approx(0.001))
    assert rt(0) == 0.0 and rt(8) == pytest.approx(0.009)
    one = fit_round_trip([(4, 5, 5 * 0.004)])  # one k: half fixed, half per token
    assert one(4) == pytest.approx(0.004) and one(8) == pytest.approx(0.006)
    assert fit_round_trip([]) == RoundTrip()


def test_a_batch_waits_for_every_sequences_own_drafting_when_it_is_per_sequence():
    """A proposer service answers a step's sequences in one call; an in-target method drafts
    them one after another: 16 sequences wait 16 of its times."""
    shared = m(0.7, rt=RoundTrip(0.002, 0.0))
    own = m(0.7, rt=RoundTrip(0.002, 0.0, per_sequence=True))
    assert batch_goodput(own, 3, 1, FLAT_THEN_STEEP) == batch_goodput(shared, 3, 1,
                                                                      FLAT_THEN_STEEP)
    assert batch_goodput(own, 3, 16, FLAT_THEN_STEEP) == pytest.approx(
        16 * own.expected(3) / (FLAT_THEN_STEEP(16 * own.tokens(3)) + 16 * 0.002))
    assert batch_goodput(own, 3, 16, FLAT_THEN_STEEP) < batch_goodput(shared, 3, 16,
                                                                      FLAT_THEN_STEEP)
    # what pays alone need not pay in a batch: off, as compute-bound
    assert choose({"eagle": own}, 1, FLAT_THEN_STEEP, 8).method == "eagle"
    busy = choose({"eagle": own}, 32, FLAT_THEN_STEEP, 8)
    assert busy.method is None and busy.reason == "compute_bound"
    assert fit_round_trip([(2, 4, 0.008)], per_sequence=True).per_sequence
    assert MethodCounts(round_trips=((2, 4, 0.008),)).round_trip(True).per_sequence


def test_marginal_goodput_of_one_sequence_in_a_batch():
    # alone: its own tokens over its own step; in a batch the others' tokens share the step
    assert marginal_goodput(m(0.5), 0, FLAT_THEN_STEEP, 0, 0, 0.0) == pytest.approx(100.0)
    assert marginal_goodput(m(0.5), 1, FLAT_THEN_STEEP, 15, 15, 0.0) == pytest.approx(
        16.5 / FLAT_THEN_STEEP(17))
    assert batch_goodput(None, 0, 16, FLAT_THEN_STEEP) == pytest.approx(16 / 0.012)
    assert batch_goodput(m(0.5), 1, 16, FLAT_THEN_STEEP) == pytest.approx(
        16 * 1.5 / (FLAT_THEN_STEEP(32) + 0.001))


def test_a_standing_cost_is_paid_paused_too_so_pausing_saves_only_the_drafting():
    # a head that learns from every verified step (4 ms) and drafts in 2 ms more: with the
    # 4 ms priced as saved by pausing, a 0.2-acceptance chain looks slower than plain decoding
    flat = StepCost((1.0, 64.0), (0.010, 0.010), 0.0)
    weak = m(0.2, rt=RoundTrip(0.006, 0.0))
    wait = weak.round_trip(1)
    unaware = [marginal_goodput(weak, k, flat, 0, 0, wait) for k in (0, 1)]
    assert unaware[0] > unaware[1]  # 100 tok/s paused against 75 drafting
    aware = [marginal_goodput(weak, k, flat, 0, 0, wait, standing_s=0.004) for k in (0, 1)]
    assert aware == pytest.approx([1 / 0.014, 1.2 / 0.016])
    assert aware[1] > aware[0]
    # asked anyway by others (no wait of its own): its standing cost is still its step's
    assert marginal_goodput(weak, 1, flat, 0, 0, 0.0, standing_s=0.004) == pytest.approx(
        1.2 / 0.014)


def test_counters_become_acceptance_and_a_method_model_in_one_way():
    # 6 accepted, 4 drafts with a rejection: 10 positions tried; 4 of 9 asks got a draft
    acc = Acceptance.from_counts(6, 4, 4, 9, (9, 9, 5), (4, 3, 1), (3, 2, 1))
    assert acc == Acceptance(6, 10, 4, 9, (9, 9, 5), (4, 3, 1), (3, 2, 1))
    model = MethodModel.from_acceptance(acc, FAST, max_draft=2)
    a, h = acc.rate(), acc.hit_rate()
    assert model == MethodModel(a, h, FAST, 2, acc.positions(a, h))
    assert a == pytest.approx((6 + 0.7 * 20) / (10 + 20))
    counts = MethodCounts(acc, Acceptance.from_counts(0, 0, 16, 16), ((3, 10.0, 0.05),
                                                                      (8, 10.0, 0.1)), 5)
    assert counts.draft_limit() == 5  # 20 drafts, never more than 5 though 8 were asked
    assert counts.round_trip() == fit_round_trip(counts.round_trips)
    assert counts.acceptance(True) is acc and counts.acceptance(False).drafts == 16
