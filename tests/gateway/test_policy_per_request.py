"""auto per request (gateway/policy.py, splitspec/goodput.py): a request's prompt class selects
the acceptance its candidates are priced with, once that class has data; a long prompt first
explores retrieval drafts; off still has to be beaten. Planted controls: the prompt ignored, and
the class's data ignored."""

from __future__ import annotations

import pytest
from test_policy import ADDRESS, AUTO, INFO, load, policy, snapshot

from gateway.policy import PLD_SHAPE, shaped_name
from splitspec.goodput import LONG_PROMPT_TOKENS, prompt_class

HYBRID = "hybrid:ngram+mlp"
GATED = "hybrid:ngram|mlp"
PLD = shaped_name(*PLD_SHAPE)
LONG, SHORT = 4 * LONG_PROMPT_TOKENS, 40  # prompt tokens


def served(**config):
    """Over all requests the MLP accepts best; n-gram (at its own range and at prompt lookup's
    shape) and their hybrids measured too."""
    return policy(snapshot(greedy={"mlp": (700, 1000), "ngram": (350, 1000), PLD: (350, 1000),
                                   HYBRID: (500, 1000), GATED: (450, 1000)}), **config)


def finished(p, cls: str, method: str, accepted: int, proposed: int, n: int = 20) -> None:
    """n finished requests of the class, each with these usage counts over 10 steps."""
    for _ in range(n):
        p.estimates.observe_request(cls, method, True, 1, accepted, proposed, 10)


def test_prompt_class_by_length():
    assert prompt_class(SHORT) == "short" and prompt_class(LONG) == "long"
    assert prompt_class(LONG_PROMPT_TOKENS - 1) == "short"


def test_a_long_prompt_that_measured_retrieval_well_gets_retrieval_drafts():
    p = served()
    # long prompts: answers quote them, prompt lookup (and its hybrid) accepts nearly all
    finished(p, "long", "ngram", accepted=38, proposed=40)
    finished(p, "long", HYBRID, accepted=39, proposed=40)
    finished(p, "long", "mlp", accepted=20, proposed=40)
    # short prompts: n-gram rarely right
    finished(p, "short", "ngram", accepted=2, proposed=40)
    finished(p, "short", "mlp", accepted=30, proposed=40)
    long_d = p.decide(AUTO, INFO, True, load(), prompt_tokens=LONG)
    short_d = p.decide(AUTO, INFO, True, load(), prompt_tokens=SHORT)
    assert long_d.plan.method in ("ngram", HYBRID, GATED) and long_d.reason == "goodput"
    assert short_d.plan.method == "mlp"
    # no prompt length known: the all-requests estimate, as before
    assert p.decide(AUTO, INFO, True, load()).plan.method == "mlp"


def test_a_class_where_nothing_pays_is_decoded_plainly():
    p = served()
    for m in ("ngram", PLD, "mlp", HYBRID, GATED):
        finished(p, "long", m, accepted=0, proposed=40)
    d = p.decide(AUTO, INFO, True, load(), prompt_tokens=LONG)
    assert not d.plan.enabled and d.reason == "low_acceptance"
    assert p.decide(AUTO, INFO, True, load(), prompt_tokens=SHORT).plan.enabled


def test_a_class_with_too_little_data_is_priced_as_all_requests():
    p = served()
    finished(p, "short", "ngram", accepted=40, proposed=40, n=1)  # 40 positions: under 50
    assert p.decide(AUTO, INFO, True, load(), prompt_tokens=SHORT).plan.method == "mlp"


def test_a_long_prompt_without_its_own_data_favours_retrieval_drafts():
    """Over all requests (mostly short ones) the MLP wins; a long prompt whose class has no
    data yet prices retrieval drafts at the prior at least, and gets them, until its class
    measured them: then its own acceptance decides."""
    p = served()
    assert p.decide(AUTO, INFO, True, load(), prompt_tokens=SHORT).plan.method == "mlp"
    d = p.decide(AUTO, INFO, True, load(), prompt_tokens=LONG)
    assert d.plan.method in ("ngram", HYBRID, GATED) and d.reason == "goodput", d
    for m in ("ngram", PLD, HYBRID, GATED):
        finished(p, "long", m, accepted=5, proposed=40)
    assert p.decide(AUTO, INFO, True, load(), prompt_tokens=LONG).plan.method == "mlp"


def test_a_long_prompt_explores_retrieval_drafts_first():
    p = served(explore_every=2)
    long_ds = [p.decide(AUTO, INFO, True, load(), prompt_tokens=LONG) for _ in range(4)]
    explored = [d.plan.method for d in long_ds if d.reason == "exploration"]
    assert explored and all(m in ("ngram", HYBRID, GATED) for m in explored)
    # a short prompt's classes are measured over all requests: nothing is stale
    q = served(explore_every=2)
    assert all(q.decide(AUTO, INFO, True, load(), prompt_tokens=SHORT).reason == "goodput"
               for _ in range(4))


def test_a_finished_requests_usage_feeds_its_class():
    p = served()
    p.estimates.observe_request("long", "ngram", True, 1, accepted=30, proposed=40, steps=12)
    got = p.estimates.class_acceptance("long", "ngram", True)
    assert (got.accepted, got.tried) == (30, 40)  # 10 rejections at most, 12 steps
    assert p.estimates.class_acceptance("short", "ngram", True).tried == 0
    assert ADDRESS in p.estimates.replicas


@pytest.mark.parametrize("plant", ["policy_ignores_the_prompt",
                                   "policy_prices_a_class_without_its_data"])
@pytest.mark.parametrize("check", [
    test_a_long_prompt_that_measured_retrieval_well_gets_retrieval_drafts,
    test_a_class_where_nothing_pays_is_decoded_plainly,
    test_a_long_prompt_without_its_own_data_favours_retrieval_drafts])
def test_the_per_request_checks_catch_a_policy_blind_to_the_request(monkeypatch, plant, check):
    import planted_bugs as bug

    getattr(bug, plant)(monkeypatch)
    with pytest.raises(AssertionError):
        check()


def test_the_exploration_check_catches_a_policy_blind_to_the_prompt(monkeypatch):
    import planted_bugs as bug

    bug.policy_ignores_the_prompt(monkeypatch)
    with pytest.raises(AssertionError):
        test_a_long_prompt_explores_retrieval_drafts_first()
