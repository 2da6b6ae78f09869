"""Negative controls for the engine's invariant tests: each guarding check fails on its planted
bug (tests/planted_bugs.py); the same checks pass on the real engine in their own modules."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from test_conditioning import check_hidden_states_are_the_targets
from test_draft_collector import (
    test_a_proposer_turning_incompatible_costs_only_speculation as check_swap,
)
from test_seeded_sampling import check_seeded_output_ignores_speculation

from verifier_service.drafts.client import ProposerMismatch


@pytest.mark.parametrize("plant, check, failure", [
    (bug.hidden_state_zeroed, check_hidden_states_are_the_targets, AssertionError),
    (bug.hidden_state_shifted_by_one_position, check_hidden_states_are_the_targets,
     AssertionError),
    (bug.seeded_draws_depend_on_k, check_seeded_output_ignores_speculation, AssertionError),
    (bug.undrafted_seeded_rows_keyed_one_position_late, check_seeded_output_ignores_speculation,
     AssertionError),
    # the requests themselves fail with the mismatch: what the guarding test rules out
    (bug.mismatch_escapes_the_step, check_swap, ProposerMismatch),
], ids=["hidden-zeroed", "hidden-shifted", "seeded-draws-depend-on-k",
        "undrafted-seeded-rows-keyed-late", "late-mismatch-fails-batch"])
def test_the_guarding_check_fails_on_the_planted_bug(monkeypatch, target_model_dir, plant, check,
                                                     failure):
    plant(monkeypatch)
    with pytest.raises(failure):
        check(target_model_dir)
