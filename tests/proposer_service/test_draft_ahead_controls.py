"""Negative control for drafting ahead: a proposer that answers an outcome it did not draft
ahead for with a draft ahead of another outcome (tests/planted_bugs.py) fails the miss check."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from test_draft_ahead import check_a_miss_is_drafted_afresh, prompt, proposer  # noqa: F401


def test_the_guarding_check_fails_on_the_planted_bug(monkeypatch, proposer, prompt):  # noqa: F811
    bug.stale_draft_ahead_on_a_miss(monkeypatch)
    with pytest.raises(AssertionError):
        check_a_miss_is_drafted_afresh(proposer, prompt)
