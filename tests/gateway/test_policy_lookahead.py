"""The policy never plans a lookahead shape the verifier would refuse: the shape a plan runs is the
request's fields over the verifier's defaults (VerifierInfo.lookahead_default), and its window
must fit the verifier's node limit. auto leaves lookahead out when the defaults do not fit (a
verifier that predates the start-up check) and picks it when they do; a request whose own shape
does not fit gets INVALID_ARGUMENT naming the field, as a k above the limit does."""

from __future__ import annotations

import planted_bugs as bug
import pytest

from gateway.estimates import Estimates, MethodSnapshot, ReplicaSnapshot
from gateway.policy import Load, PolicyConfig, SpeculationPolicy
from protos import common_pb2, verifier_pb2
from splitspec.errors import InvalidArgument
from splitspec.goodput import Acceptance
from splitspec.params import LookaheadParams, SpeculationMode, SpeculationRequest
from verifier_service.methods.lookahead import LookaheadMethod, LookaheadShape

ADDRESS = "replica-0"
COST = tuple(("greedy", *b) for b in ((100, 100.0, 1.0), (100, 800.0, 1.05), (100, 1600.0, 1.1),
                                     (100, 6400.0, 6.0)))
MAX_K = 16


def info(window: int, ngram: int, guesses: int = 2) -> verifier_pb2.VerifierInfo:
    return verifier_pb2.VerifierInfo(
        model="target", max_model_len=512, default_num_speculative_tokens=4,
        max_num_speculative_tokens=MAX_K,
        proposers=[verifier_pb2.ProposerStatus(method="ngram"),
                   verifier_pb2.ProposerStatus(method="lookahead", address="in-target")],
        lookahead_default=common_pb2.LookaheadConfig(window=window, ngram=ngram,
                                                     guesses=guesses))


def lookahead_pays() -> SpeculationPolicy:
    """Measured: lookahead accepts 90 % of its positions, greedy and sampled; n-gram 5 %."""
    def counts(accepted: float, tried: float) -> Acceptance:
        return Acceptance(accepted, tried, tried - accepted, tried - accepted)

    methods = {m: MethodSnapshot(counts(a, 1000), counts(a, 1000), ((3, 100.0, 0.1),))
               for m, a in (("ngram", 50), ("lookahead", 900))}
    est = Estimates()
    est.observe(ADDRESS, ReplicaSnapshot(0, 0, 16, 400, methods, COST))
    return SpeculationPolicy(est, PolicyConfig(explore_every=1))


REQUESTS = [SpeculationRequest(), SpeculationRequest(method="lookahead"),
            SpeculationRequest(num_speculative_tokens=MAX_K),
            SpeculationRequest(SpeculationMode.ON)]


def check_plans_are_accepted(window: int, ngram: int) -> list[str]:
    """Every plan the policy makes for valid requests (auto, greedy and sampled, exploring too)
    passes the verifier's own check for a verifier with this default shape; returns the
    methods planned."""
    verifier = LookaheadMethod(LookaheadShape(window, ngram, 2))
    policy, served = lookahead_pays(), info(window, ngram)
    planned = []
    for _ in range(4):
        for req in REQUESTS:
            for greedy in (True, False):
                plan = policy.decide(req, served, greedy, Load(0, 16, ADDRESS)).plan
                if plan.method == "lookahead":
                    verifier.check_plan(plan, MAX_K)  # InvalidArgument if refused
                planned.append(plan.method)
    return planned


def test_a_default_shape_over_the_limit_is_never_planned():
    planned = check_plans_are_accepted(15, 5)  # 15 x 4 = 60 nodes > 16
    assert "lookahead" not in planned and "ngram" in planned
    # auto naming lookahead is served (without speculation), never refused
    d = lookahead_pays().decide(SpeculationRequest(method="lookahead"), info(15, 5))
    assert d.plan.method is None


def test_a_default_shape_that_fits_is_chosen_where_it_pays():
    assert "lookahead" in check_plans_are_accepted(8, 3)  # 8 x 2 = 16 nodes


def test_the_check_catches_a_policy_that_ignores_the_limit(monkeypatch):
    bug.policy_ignores_the_lookahead_limit(monkeypatch)
    with pytest.raises(InvalidArgument, match="speculation.lookahead.window"):
        check_plans_are_accepted(15, 5)


@pytest.mark.parametrize("mode", [SpeculationMode.AUTO, SpeculationMode.ON])
def test_a_requests_own_shape_over_the_limit_is_invalid_naming_the_field(mode):
    too_wide = SpeculationRequest(mode, "lookahead", lookahead=LookaheadParams(window=9))
    with pytest.raises(InvalidArgument, match="speculation.lookahead.window") as exc:
        lookahead_pays().decide(too_wide, info(4, 3))  # 9 x 2 = 18 nodes > 16
    assert "18 nodes" in str(exc.value)
    ok = SpeculationRequest(mode, "lookahead", lookahead=LookaheadParams(window=8))
    assert lookahead_pays().decide(ok, info(4, 3)).plan.lookahead == LookaheadParams(window=8)


def test_on_with_lookahead_and_a_default_over_the_limit_names_the_field():
    with pytest.raises(InvalidArgument, match="speculation.lookahead.window"):
        lookahead_pays().decide(SpeculationRequest(SpeculationMode.ON, "lookahead"), info(15, 5))
