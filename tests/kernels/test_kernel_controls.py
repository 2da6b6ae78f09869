"""Negative controls for the rejection sampler's invariant tests: each guarding check passes on
the real sampler and fails on its planted bug (tests/planted_bugs.py)."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from test_convergence import check_every_position_converges, check_first_token_converges
from test_rejection import check_seeded_output_ignores_drafts


@pytest.mark.parametrize("plant, check", [
    (bug.residual_from_p, lambda: check_first_token_converges(20, 3, "dense")),
    (bug.bonus_row_off_by_one, check_every_position_converges),
    (bug.seeded_draws_depend_on_k, check_seeded_output_ignores_drafts),
], ids=["residual-from-p", "bonus-row-off-by-one", "seeded-draws-depend-on-k"])
def test_the_guarding_check_fails_on_the_planted_bug(monkeypatch, plant, check):
    check()  # the real sampler passes
    plant(monkeypatch)
    with pytest.raises(AssertionError):
        check()
