"""Negative controls for prompt lookup's shape in auto (test_policy_prompt_lookup.py): the
checks fail on a policy that drops the shape from its candidates and on a front door that
measures the shape's usage as plain ngram's (tests/planted_bugs.py)."""

from __future__ import annotations

import planted_bugs as bug
import pytest
import test_policy_prompt_lookup as checks


@pytest.mark.parametrize("check", [
    checks.test_auto_runs_the_shape_where_it_measured_best,
    checks.test_auto_decides_the_shape_per_request_from_the_prompts_class])
def test_the_checks_catch_a_policy_without_the_shape(monkeypatch, check):
    check()  # the real policy passes
    bug.policy_drops_prompt_lookups_shape(monkeypatch)
    with pytest.raises(AssertionError):
        check()


def test_the_measuring_check_catches_the_shape_counted_as_ngram(monkeypatch):
    checks.test_the_shapes_usage_is_measured_under_its_own_name()
    bug.policy_measures_the_shape_as_plain_ngram(monkeypatch)
    with pytest.raises(AssertionError):
        checks.test_the_shapes_usage_is_measured_under_its_own_name()
