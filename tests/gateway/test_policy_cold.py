"""auto from a cold start (gateway/policy.py): with nothing measured it runs the served retrieval
drafts as one gated chain (hybrid:suffix|ngram) rather than off or a method it knows nothing
about; gated hybrids are candidates priced from their own acceptance; what is explored stays
bounded; a finished request's class acceptance counts its drafts' rejections, not its steps.
Planted controls: no cold default, no gated hybrids, every step counted as a rejection."""

from __future__ import annotations

import pytest
from test_policy import ADDRESS, AUTO, COST, load, policy, snapshot

from gateway.estimates import Estimates, ReplicaSnapshot
from gateway.policy import PolicyConfig, SpeculationPolicy
from protos import verifier_pb2
from splitspec.goodput import request_acceptance

SERVED = ("ngram", "suffix", "draft", "mlp", "eagle")
INFO = verifier_pb2.VerifierInfo(
    model="target", max_model_len=512, default_num_speculative_tokens=4,
    max_num_speculative_tokens=8, max_num_branches=4,
    proposers=[verifier_pb2.ProposerStatus(method=m) for m in SERVED])
CHAIN = "hybrid:suffix|ngram"
MODEL_BACKED = ("draft", "mlp", "eagle")


def cold(**config) -> SpeculationPolicy:
    """A gateway whose replica has measured its step times but no method yet."""
    est = Estimates()
    est.observe(ADDRESS, ReplicaSnapshot(0, 0, 16, 400, {}, COST))
    config.setdefault("explore_every", 0)
    return SpeculationPolicy(est, PolicyConfig(**config))


def test_cold_auto_runs_the_gated_retrieval_chain_not_off_or_an_unmeasured_model():
    # step times measured, no method yet
    d = cold().decide(AUTO, INFO, True, load())
    assert (d.plan.method, d.reason) == (CHAIN, "goodput"), d
    # chains (a gated hybrid of one method per tier), re-decided per step from 0: a
    # request whose own drafts fail pauses
    assert d.plan.num_branches == 1 and d.plan.adaptive and d.plan.k_min == 0
    # nothing known at all, not even a step's time: off until a step is measured
    d = SpeculationPolicy().decide(AUTO, INFO, True, load())
    assert (d.plan.enabled, d.reason) == (False, "unmeasured_batch"), d
    # only one retrieval method served: that one
    one = verifier_pb2.VerifierInfo()
    one.CopyFrom(INFO)
    del one.proposers[1]  # suffix
    assert cold().decide(AUTO, one, True, load()).plan.method == "ngram"


def test_a_measured_method_that_beats_the_chain_wins_and_unmeasured_ones_wait():
    # the MLP measured well: it competes and wins; EAGLE and the draft model, unmeasured,
    # do not compete on the prior
    p = policy(snapshot(greedy={"mlp": (900, 1000), CHAIN: (300, 1000)}))
    assert p.decide(AUTO, INFO, True, load()).plan.method == "mlp"
    q = policy(snapshot(greedy={"mlp": (100, 1000), CHAIN: (600, 1000)}))
    assert q.decide(AUTO, INFO, True, load()).plan.method == CHAIN


def test_gated_hybrids_are_candidates_priced_from_their_own_acceptance():
    base = {"ngram": (400, 1000), "suffix": (400, 1000), "mlp": (100, 1000),
            "draft": (100, 1000), "eagle": (100, 1000)}
    good = policy(snapshot(greedy={**base, CHAIN: (800, 1000), "hybrid:suffix|eagle":
                                   (100, 1000)}))
    assert good.decide(AUTO, INFO, True, load()).plan.method == CHAIN
    # the same chain measured poorly: a single method wins
    poor = policy(snapshot(greedy={**base, CHAIN: (50, 1000), "hybrid:suffix|eagle":
                                   (100, 1000)}))
    assert poor.decide(AUTO, INFO, True, load()).plan.method in ("ngram", "suffix")
    # retrieval before a model-backed drafter is a gated candidate too, once measured
    model_tier = policy(snapshot(greedy={**base, CHAIN: (50, 1000), "hybrid:suffix|eagle":
                                         (850, 1000)}))
    assert model_tier.decide(AUTO, INFO, True, load()).plan.method == "hybrid:suffix|eagle"


def test_a_cold_run_explores_a_bounded_few_requests():
    """35 requests on a cold stack (the acceptance never measured, the worst case for it):
    all but the exploration turns run the chain, and the turns are at most 1 in
    EXPLORE_EVERY; none is off."""
    p = cold(explore_every=PolicyConfig().explore_every)
    decisions = [p.decide(AUTO, INFO, True, load()) for _ in range(35)]
    explored = [d for d in decisions if d.reason == "exploration"]
    assert len(explored) <= 35 // PolicyConfig().explore_every
    assert all(d.plan.method == CHAIN for d in decisions if d.reason != "exploration")


def test_a_requests_class_acceptance_counts_its_drafts_rejections_not_its_steps():
    # 24 drafts in 55 steps, 9 tokens of 82 accepted: every draft had a rejection at most
    got = request_acceptance(accepted=9, proposed=82, steps=55, rejections=24)
    assert (got.accepted, got.tried) == (9, 33)
    # an older verifier reports none: the bound by steps, as before
    assert request_acceptance(9, 82, 55, 0).tried == 64
    assert request_acceptance(9, 82, 55).tried == 64
    assert request_acceptance(40, 40, 10, 0).tried == 40  # all accepted: no rejection
    p = cold()
    for _ in range(3):  # short prompts where suffix drafts on a third of the steps
        p.estimates.observe_request("short", CHAIN, True, 1, accepted=30, proposed=80,
                                    steps=60, rejections=20)
    # 90 accepted of 150 tried (older counts decayed a little): not 90 of 240
    assert p.estimates.class_acceptance("short", CHAIN, True).tried == pytest.approx(150,
                                                                                  rel=0.05)
    d = p.decide(AUTO, INFO, True, load(), prompt_tokens=40)
    assert (d.plan.method, d.reason) == (CHAIN, "goodput"), d


@pytest.mark.parametrize("plant, check", [
    ("policy_has_no_cold_default",
     test_cold_auto_runs_the_gated_retrieval_chain_not_off_or_an_unmeasured_model),
    ("policy_has_no_cold_default", test_a_cold_run_explores_a_bounded_few_requests),
    ("policy_weighs_no_gated_hybrids",
     test_gated_hybrids_are_candidates_priced_from_their_own_acceptance),
    ("policy_weighs_no_gated_hybrids",
     test_cold_auto_runs_the_gated_retrieval_chain_not_off_or_an_unmeasured_model),
    ("class_acceptance_counts_every_step_rejected",
     test_a_requests_class_acceptance_counts_its_drafts_rejections_not_its_steps),
])
def test_the_cold_start_checks_catch_their_planted_bugs(monkeypatch, plant, check):
    import planted_bugs as bug

    getattr(bug, plant)(monkeypatch)
    with pytest.raises(AssertionError):
        check()


def test_unmeasured_model_backed_methods_are_not_chosen_cold():
    p = cold()
    chosen = {p.decide(AUTO, INFO, True, load()).plan.method for _ in range(8)}
    assert not chosen & set(MODEL_BACKED) and None not in chosen
