"""Negative control for the drafting test: a proposer whose tokens do not come from the q it
reports (tests/planted_bugs.py) fails it, seeded or not."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from test_draft_sampling import check_tokens_come_from_the_q_sent


@pytest.mark.parametrize("seeded", [False, True])
def test_the_guarding_check_fails_on_the_planted_bug(monkeypatch, seeded):
    bug.draft_q_is_not_the_sampled_one(monkeypatch)
    with pytest.raises(AssertionError):
        check_tokens_come_from_the_q_sent(seeded)
