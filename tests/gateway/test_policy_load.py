"""auto under load and from a cold start (gateway/policy.py, docs/policy.md "Cold start" and
"Under load"): on a replica where a draft row costs about what a decoding sequence does at a
large batch (a CPU), a full batch decodes plainly however well the drafts are accepted; a batch
whose size the replica has not measured is not priced on the curve of smaller steps; an
exploration turn is not spent on a batch its prior already loses on. Planted controls: the
unmeasured batch priced anyway, exploration forced on a compute-bound batch."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from test_policy import ADDRESS, AUTO, INFO

from gateway.estimates import Estimates, MethodSnapshot, ReplicaSnapshot
from gateway.policy import Load, PolicyConfig, SpeculationPolicy
from splitspec.goodput import Acceptance, MethodModel, RoundTrip, batch_goodput

MS = 0.001
# (tokens, milliseconds) per class of sequence counts, as a CPU measures them: one sequence's
# step 38 ms and 3 ms per draft row; eight sequences' 100 ms and 10 ms per further row, about
# what one more decoding sequence costs there (100 / 8 = 12.5 ms)
ONE = ((1, 38.0), (5, 50.0))
EIGHT = ((8, 100.0), (16, 180.0))
STEPS = 100


def replica(classes: dict[int, tuple[tuple[int, float], ...]],
            acceptance: dict[str, tuple[float, float]]) -> ReplicaSnapshot:
    """A replica's stats: step times per class of sequence counts (and the same steps pooled),
    and (accepted, tried) positions per method, every asked step drafting."""
    by_seqs = tuple(("greedy", c, STEPS, float(t * STEPS), ms * MS * STEPS)
                    for c, points in classes.items() for t, ms in points)
    pooled = tuple((kind, n, t, s) for kind, _, n, t, s in by_seqs)

    def counts(accepted: float, tried: float) -> Acceptance:
        return Acceptance(accepted, tried, tried - accepted, tried - accepted)

    methods = {m: MethodSnapshot(counts(*acc), counts(*acc), ((2, 100.0, 0.1),))
               for m, acc in acceptance.items()}
    return ReplicaSnapshot(0, 0, 8, 400, methods, pooled, by_seqs)


GOOD = {"ngram": (700.0, 1000.0), "mlp": (700.0, 1000.0)}


def policy(snap: ReplicaSnapshot, explore_every: int = 0) -> SpeculationPolicy:
    est = Estimates()
    est.observe(ADDRESS, snap)
    return SpeculationPolicy(est, PolicyConfig(explore_every=explore_every))


def at(batch: int) -> Load:
    return Load(batch - 1, 8, ADDRESS)


def test_a_full_batch_where_rows_cost_what_sequences_do_decodes_plainly():
    p = policy(replica({1: ONE, 8: EIGHT}, GOOD))
    alone = p.decide(AUTO, INFO, True, at(1))
    assert alone.plan.enabled and alone.reason == "goodput", alone  # drafts pay alone
    full = p.decide(AUTO, INFO, True, at(8))
    assert (full.plan.enabled, full.reason) == (False, "compute_bound"), full
    # the premise: every k of the measured method is predicted slower than off at 8
    cost = p.estimates.cost(ADDRESS, "greedy", 8)
    model = MethodModel.from_acceptance(Acceptance(700, 1000, 300, 300), RoundTrip())
    off = batch_goodput(None, 0, 8, cost)
    assert all(batch_goodput(model, k, 8, cost) < off for k in range(1, 9))


def test_a_batch_the_replica_never_ran_is_not_priced_on_smaller_steps():
    """A cold burst: the replica measured one sequence's steps only. Extrapolated, that curve
    prices eight sequences' draft rows at 3 ms and speculation wins; the batch is priced only
    once its own steps are measured, and plain decoding measures them."""
    p = policy(replica({1: ONE}, GOOD))
    assert p.decide(AUTO, INFO, True, at(1)).plan.enabled  # measured: drafts pay alone
    for queued in range(1, 8):  # the burst's later requests join a batch of 2..8
        d = p.decide(AUTO, INFO, True, at(queued + 1))
        assert (d.plan.enabled, d.reason) == (False, "unmeasured_batch"), (queued, d)
    # measured (the steps it ran plainly): priced on its own curve, off since rows are dear
    p.estimates.observe(ADDRESS, replica({1: ONE, 8: EIGHT}, GOOD))
    assert p.decide(AUTO, INFO, True, at(8)).reason == "compute_bound"


def test_a_cold_start_never_speculates_on_what_it_has_not_measured():
    """Nothing measured, not even a step: off. Steps measured, no method: the cold default
    (retrieval drafts) only where its prior beats off at this batch, never at a batch the
    replica has not run."""
    est = Estimates()
    p = SpeculationPolicy(est, PolicyConfig(explore_every=0))
    assert p.decide(AUTO, INFO, True, at(1)).reason == "unmeasured_batch"
    assert p.decide(AUTO, INFO, True, Load()).reason == "unmeasured_batch"  # no replica known
    est.observe(ADDRESS, replica({1: ONE}, {}))
    cold = p.decide(AUTO, INFO, True, at(1))
    assert (cold.plan.method, cold.reason) == ("ngram", "goodput"), cold
    assert not p.decide(AUTO, INFO, True, at(4)).plan.enabled
    est.observe(ADDRESS, replica({1: ONE, 8: EIGHT}, {}))
    assert p.decide(AUTO, INFO, True, at(8)).reason == "compute_bound"


def test_an_exploration_turn_waits_for_a_batch_its_prior_pays_in():
    """Every decision is an exploration turn here and the MLP is stale (no data): at a full
    batch, where rows cost what sequences do, even its prior loses to off, so the turn waits;
    the next decision that runs alone takes it."""
    p = policy(replica({1: ONE, 8: EIGHT}, {"ngram": (700.0, 1000.0)}), explore_every=1)
    full = p.decide(AUTO, INFO, True, at(8))
    assert full.reason != "exploration" and not full.plan.enabled, full
    assert p.exploration_held
    alone = p.decide(AUTO, INFO, True, at(1))
    assert alone.reason == "exploration" and alone.plan.k >= 1, alone


@pytest.mark.parametrize("plant, check", [
    ("policy_prices_an_unmeasured_batch",
     test_a_batch_the_replica_never_ran_is_not_priced_on_smaller_steps),
    ("policy_prices_an_unmeasured_batch",
     test_a_cold_start_never_speculates_on_what_it_has_not_measured),
    ("policy_explores_whatever_the_batch",
     test_an_exploration_turn_waits_for_a_batch_its_prior_pays_in),
])
def test_the_load_checks_catch_their_planted_bugs(monkeypatch, plant, check):
    check()  # the real policy passes
    getattr(bug, plant)(monkeypatch)
    with pytest.raises(AssertionError):
        check()
