"""Negative controls for the tool tests: each guarding check fails on its planted bug
(tests/planted_bugs.py); the same checks pass on the real code in their own modules."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from test_tool_parsers import (
    TWO_CALLS,
    check_every_split,
    check_hermes_reads_calls_and_keeps_the_text_outside_them,
)
from test_tool_requests import (
    check_required_is_held_to_an_array_of_calls_one_branch_per_tool,
    check_stream_reassembles,
)

from gateway.tool_parsers.hermes import HermesParser


@pytest.mark.parametrize("plant, check", [
    (bug.hermes_drops_text_before_a_call,
     check_hermes_reads_calls_and_keeps_the_text_outside_them),
    (bug.hermes_holds_nothing_back, lambda: check_every_split(HermesParser, TWO_CALLS)),
    (bug.tool_deltas_lose_an_argument_fragment, lambda: check_stream_reassembles("required")),
    (bug.tool_deltas_lose_an_argument_fragment, lambda: check_stream_reassembles("named")),
    (bug.required_schema_ignores_parameters,
     check_required_is_held_to_an_array_of_calls_one_branch_per_tool),
], ids=["hermes-drops-text-before-a-call", "hermes-holds-nothing-back",
        "deltas-lose-a-fragment-required", "deltas-lose-a-fragment-named",
        "required-schema-ignores-parameters"])
def test_the_guarding_check_fails_on_the_planted_bug(monkeypatch, plant, check):
    plant(monkeypatch)
    # a failed pytest.raises inside the check fails as pytest.fail does
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        check()
