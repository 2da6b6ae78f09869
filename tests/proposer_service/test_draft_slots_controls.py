"""Negative controls for the draft's resident cache (tests/planted_bugs.py): a drafted-ahead
state that takes its slot over without its columns, a finished sequence's cache kept as views of
a slot that is reused, and the captured loop drafting its rows one position late, each fail the
check that guards them."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from test_draft_slots import (  # noqa: F401
    check_greedy_runs,
    check_prefix_reuse_after_the_slot_is_reused,
    graph_pair,
    pair,
    prefixed_pair,
)


def test_a_drafted_ahead_state_left_out_of_its_slot_fails_the_check(monkeypatch,
                                                                    pair):  # noqa: F811
    bug.drafted_ahead_state_left_out_of_its_slot(monkeypatch)
    with pytest.raises(AssertionError):
        check_greedy_runs(pair, ahead=True)


def test_a_finished_slot_kept_as_views_fails_the_check(monkeypatch, prefixed_pair):  # noqa: F811
    bug.finished_slot_kept_as_views(monkeypatch)
    with pytest.raises(AssertionError):
        check_prefix_reuse_after_the_slot_is_reused(prefixed_pair)


def test_the_captured_loop_one_position_late_fails_the_check(monkeypatch,
                                                             graph_pair):  # noqa: F811
    bug.fixed_cache_rows_drafted_one_position_late(monkeypatch)
    with pytest.raises(AssertionError):
        check_greedy_runs(graph_pair, ahead=False)
