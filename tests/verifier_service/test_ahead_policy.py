"""The drafting-ahead policy: auto keeps drafting ahead while it is cheaper per token, probes the
other setting every period and switches only when that is clearly cheaper; on/off pin it."""

from __future__ import annotations

import pytest

from verifier_service.drafts.ahead_policy import FIRST_PERIOD, PERIOD, PROBE, AheadPolicy


def drive(policy: AheadPolicy, steps: int, cost: dict[bool, float], method: str = "draft"
          ) -> list[bool]:
    """Run `steps` steps, each emitting 3 tokens at cost[setting] seconds; the settings used."""
    used = []
    for _ in range(steps):
        ahead = policy.use(method)
        used.append(ahead)
        policy.record(method, ahead, cost[ahead], 3)
    return used


def test_auto_starts_ahead_and_keeps_it_while_it_pays():
    policy = AheadPolicy("auto")
    used = drive(policy, FIRST_PERIOD + 2 * PERIOD, {True: 0.010, False: 0.014})
    assert used[0] is True
    assert used.count(False) == 3 * PROBE  # only the probes at the end of each period
    assert policy.choice("draft") is True and policy.switches == 0


def test_auto_switches_off_when_drafting_ahead_costs_more_and_back_when_it_pays_again():
    policy = AheadPolicy("auto")
    drive(policy, FIRST_PERIOD, {True: 0.020, False: 0.012})
    assert policy.choice("draft") is False
    used = drive(policy, PERIOD, {True: 0.020, False: 0.012})
    assert used.count(True) == PROBE and policy.choice("draft") is False
    drive(policy, PERIOD, {True: 0.008, False: 0.012})  # e.g. the proposer got its own cores
    assert policy.choice("draft") is True and policy.switches == 2


def test_auto_does_not_flap_on_a_difference_within_the_margin():
    policy = AheadPolicy("auto")
    drive(policy, FIRST_PERIOD + 3 * PERIOD, {True: 0.0100, False: 0.0098})
    assert policy.choice("draft") is True and policy.switches == 0


def test_methods_are_decided_separately():
    policy = AheadPolicy("auto")
    drive(policy, FIRST_PERIOD, {True: 0.020, False: 0.010}, method="draft")
    drive(policy, FIRST_PERIOD, {True: 0.010, False: 0.020}, method="other")
    assert policy.choice("draft") is False and policy.choice("other") is True


@pytest.mark.parametrize("mode,expected", [("on", True), ("off", False)])
def test_on_and_off_pin_the_setting(mode, expected):
    policy = AheadPolicy(mode)
    assert set(drive(policy, FIRST_PERIOD + PERIOD, {True: 0.02, False: 0.01})) == {expected}


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="draft_ahead"):
        AheadPolicy("sometimes")
