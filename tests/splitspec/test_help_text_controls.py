"""Negative controls for the help-text check (tests/splitspec/test_help_texts.py): it passes on
the real parsers and fails on each planted bug (tests/planted_bugs.py)."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from test_help_texts import check_help_texts


@pytest.mark.parametrize("plant", [bug.help_default_shown_twice, bug.health_flag_without_help,
                                   bug.switch_default_unsaid],
                         ids=["default-shown-twice", "flag-without-help", "switch-default-unsaid"])
def test_the_help_check_fails_on_the_planted_bug(monkeypatch, plant):
    check_help_texts()  # the real parsers pass
    plant(monkeypatch)
    with pytest.raises(AssertionError):
        check_help_texts()
