"""The policy never plans a lookahead shape the verifier would refuse: the shape a plan runs is the
request's fields over the verifier's defaults (VerifierInfo.lookahead_default), and its window
must fit the verifier's node limit. auto leaves lookahead out when the defaults do not fit (a
verifier that predates the start-up check) and picks it when they do; a request whose own shape
does not fit gets INVALID_ARGUMENT naming the field, as a k above the limit does. Every
lookahead plan's node budget holds a whole step: the window and the pool's candidates beside it
(the verifier's own drafting decides, on a sequence whose pool has a match)."""

from __future__ import annotations

import planted_bugs as bug
import pytest

from gateway.estimates import Estimates, MethodSnapshot, ReplicaSnapshot
from gateway.policy import Load, PolicyConfig, SpeculationPolicy
from protos import common_pb2, verifier_pb2
from splitspec.errors import InvalidArgument
from splitspec.goodput import Acceptance
from splitspec.params import (
    LookaheadParams,
    SamplingParams,
    SpeculationMode,
    SpeculationRequest,
)
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
    # on the replica whose steps it measured (with no replica known, auto decodes plainly)
    assert lookahead_pays().decide(ok, info(4, 3), load=Load(0, 16, ADDRESS)).plan.lookahead \
        == LookaheadParams(window=8)


def test_on_with_lookahead_and_a_default_over_the_limit_names_the_field():
    with pytest.raises(InvalidArgument, match="speculation.lookahead.window"):
        lookahead_pays().decide(SpeculationRequest(SpeculationMode.ON, "lookahead"), info(15, 5))


def fill_the_window(state, tokens: list[int]) -> None:
    """Steps a fresh state until its window holds all N - 1 levels (it starts with one and
    grows a level a step), each step fed whole and emitting one token."""
    while len(state.levels) < state.shape.ngram - 1:
        draft = state.propose(tokens, state.shape.max_nodes)
        state.observe([tokens[-1]], [0] * len(draft.tokens), tokens)


def check_plans_hold_a_whole_step(window: int = 3, ngram: int = 3, guesses: int = 2) -> int:
    """Every lookahead plan the policy makes (on without k, auto; greedy and sampled) gives the
    verifier's drafting room for its window and for the pool's candidates, at the first step's
    k and at the per-step floor k_min: the verifier's own LookaheadState proposes both on a
    sequence that repeats itself. Returns how many lookahead plans were checked."""
    method = LookaheadMethod(LookaheadShape(window, ngram, guesses))
    policy, served = lookahead_pays(), info(window, ngram, guesses)
    tokens = [5, 6, 7, 8] * 4 + [5]  # the pool holds 5 -> (6, 7, ...)
    checked = 0
    for _ in range(4):
        for req in (SpeculationRequest(SpeculationMode.ON, "lookahead"), *REQUESTS[:2]):
            for greedy in (True, False):
                plan = policy.decide(req, served, greedy, Load(0, 16, ADDRESS)).plan
                if plan.method != "lookahead":
                    continue
                checked += 1
                for budget in {plan.k, plan.k_min} if plan.adaptive else {plan.k}:
                    seq = method.admit(f"r{checked}", tokens, SamplingParams(), plan)
                    fill_the_window(seq.state, tokens)
                    draft = seq.state.propose(tokens, budget)
                    seq.free()
                    assert draft.window_levels == ngram - 1, (plan, budget)
                    assert draft.num_candidates == ngram - 1, (plan, budget)
    return checked


def test_a_lookahead_plan_holds_the_window_and_the_candidates():
    assert check_plans_hold_a_whole_step() > 0
    assert check_plans_hold_a_whole_step(window=2, ngram=4, guesses=3) > 0


def test_the_check_catches_a_floor_of_the_window_alone(monkeypatch):
    bug.lookahead_floor_of_the_window_alone(monkeypatch)
    with pytest.raises(AssertionError):
        check_plans_hold_a_whole_step()
