"""The grammar drafter in the gateway's policy (gateway/policy.py): offered to structured
requests only. For any other request it is never a candidate: not chosen however well it
measured, never explored, never a cold default, and `auto` naming it runs off; for a structured
request `auto` weighs it alone and first in a hybrid with each served proposer, starts there
cold, and explores those hybrids. Planted control: a policy that offers it to every request."""

from __future__ import annotations

import pytest
from test_policy import ADDRESS, AUTO, COST, load, policy, snapshot

import gateway.policy as policy_module
from gateway.estimates import Estimates, ReplicaSnapshot
from gateway.policy import PolicyConfig, SpeculationPolicy
from protos import verifier_pb2
from splitspec.methods import components_of, structured_only
from splitspec.params import SpeculationMode, SpeculationRequest

SERVED = ("ngram", "suffix", "draft", "mlp", "lookahead", "eagle", "grammar")
INFO = verifier_pb2.VerifierInfo(
    model="target", max_model_len=512, default_num_speculative_tokens=4,
    max_num_speculative_tokens=8, max_num_branches=4,
    proposers=[verifier_pb2.ProposerStatus(method=m) for m in SERVED])
FORCED_HYBRIDS = ("hybrid:grammar+ngram", "hybrid:grammar+suffix", "hybrid:grammar+draft",
                  "hybrid:grammar+mlp")


def cold(**config) -> SpeculationPolicy:
    est = Estimates()
    est.observe(ADDRESS, ReplicaSnapshot(0, 0, 16, 400, {}, COST))
    config.setdefault("explore_every", 0)
    return SpeculationPolicy(est, PolicyConfig(**config))


def check_unstructured_requests_never_get_it() -> None:
    """Every auto decision for an unstructured request, cold, exploring each turn, and with
    the grammar measured best of all, is a method without the grammar in it."""
    exploring = cold(explore_every=1)
    measured = policy(snapshot(greedy={"grammar": (990, 1000), "hybrid:grammar+suffix":
                                       (990, 1000), "ngram": (300, 1000)}))
    decisions = [cold().decide(AUTO, INFO, True, load())]
    decisions += [exploring.decide(AUTO, INFO, greedy, load()) for greedy in (True, False)
                  for _ in range(40)]
    decisions += [measured.decide(AUTO, INFO, True, load()) for _ in range(3)]
    decisions += [SpeculationPolicy().decide(SpeculationRequest(SpeculationMode.ON), INFO)]
    methods = {d.plan.method for d in decisions}
    assert not any(structured_only(m) for m in methods if m), methods
    # auto naming it: it could draft nothing here, so off
    d = measured.decide(SpeculationRequest(method="grammar"), INFO, True, load())
    assert (d.plan.method, d.reason) == (None, "no_proposer")


def test_an_unstructured_request_never_gets_the_grammar_drafter():
    check_unstructured_requests_never_get_it()


def test_the_check_catches_a_policy_that_offers_it_to_every_request(monkeypatch):
    real = policy_module.SpeculationPolicy.decide

    def everyone(self, req, info, greedy=True, load=None, prompt_tokens=None,
                 structured=False):
        return real(self, req, info, greedy, load or policy_module.Load(), prompt_tokens,
                    structured=True)

    monkeypatch.setattr(policy_module.SpeculationPolicy, "decide", everyone)
    with pytest.raises(AssertionError):
        check_unstructured_requests_never_get_it()


def test_a_structured_request_starts_on_the_grammar_and_weighs_its_hybrids():
    d = cold().decide(AUTO, INFO, True, load(), structured=True)
    assert (d.plan.method, d.plan.num_branches) == ("grammar", 1) and d.plan.adaptive
    # the hybrids auto weighs (and explores) for it: the grammar first, with each served
    # proposer and beside EAGLE; never with lookahead (its window joins no hybrid)
    hybrids = policy_module._hybrids(SERVED)
    assert set(FORCED_HYBRIDS) <= set(hybrids) and "hybrid:grammar+eagle" in hybrids
    assert "hybrid:grammar+lookahead" not in hybrids
    stale = policy(snapshot(greedy={"grammar": (300, 1000)}), explore_every=1)
    explored = stale.decide(AUTO, INFO, True, load(), structured=True)
    assert explored.reason == "exploration" and explored.plan.method != "grammar"
    # measured: the best wins, alone or in a hybrid
    best = policy(snapshot(greedy={"grammar": (300, 1000), "hybrid:grammar+suffix":
                                   (900, 1000), "suffix": (200, 1000)}))
    assert best.decide(AUTO, INFO, True, load(), structured=True).plan.method == \
        "hybrid:grammar+suffix"
    alone = policy(snapshot(greedy={"grammar": (950, 1000), "hybrid:grammar+suffix":
                                    (200, 1000), "suffix": (200, 1000)}))
    assert alone.decide(AUTO, INFO, True, load(), structured=True).plan.method == "grammar"


def test_a_structured_request_may_name_the_grammar_or_its_hybrid():
    for method in ("grammar", "hybrid:grammar+ngram"):
        for mode in (SpeculationMode.ON, SpeculationMode.AUTO):
            d = cold().decide(SpeculationRequest(mode, method=method, num_speculative_tokens=4),
                              INFO, True, load(), structured=True)
            assert d.plan.method == method and d.plan.k == 4, (mode, d)
            assert all(c in SERVED for c in components_of(d.plan.method))
