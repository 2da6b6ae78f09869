"""Negative controls for the reference check (tests/docs/test_docs_reference.py): it passes on
the committed pages and fails on each planted change to the code they describe
(tests/planted_bugs.py): a new flag, a new metric."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from test_docs_reference import check_reference


@pytest.mark.parametrize("plant", [bug.health_flag_undocumented, bug.gateway_metric_undocumented],
                         ids=["new-flag", "new-metric"])
def test_the_reference_check_fails_on_the_planted_change(monkeypatch, plant):
    check_reference()  # the committed pages pass
    plant(monkeypatch)
    with pytest.raises(AssertionError, match="out of date"):
        check_reference()
