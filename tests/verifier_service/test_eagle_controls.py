"""Negative controls for the EAGLE head's tests: each planted bug (tests/planted_bugs.py) breaks
one thing the format or the head's state must keep, and the guarding check fails on it."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from eagle_testlib import PROMPT_TOKENS, eagle3_sequence, tiny_target
from test_eagle_format import (
    check_advance_replaces_guesses,
    check_bias_decides,
    check_eagle1_redrafts_emitted,
    check_eagle3_drafts_previous_token,
    check_sequences_together_draft_as_alone,
    check_tree_matches_reference,
    eagle1_identity_checkpoint,
    eagle3_embedding_checkpoint,
)
from test_eagle_sampling import (
    check_sampled_chains_together_as_alone,
    check_tokens_come_from_the_q_sent,
)
from test_speculators_format import (
    check_library_head_scores_as_the_library,
    check_speculators_loads_as_published,
)


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=1)


def test_swapped_fc_halves_fail_the_eagle1_semantics(monkeypatch, tmp_path, target):
    path = eagle1_identity_checkpoint(tmp_path)
    check_eagle1_redrafts_emitted(path, target)
    bug.eagle1_fc_reads_hidden_first(monkeypatch)
    with pytest.raises(AssertionError):
        check_eagle1_redrafts_emitted(path, target)


def test_a_dropped_bias_fails_the_bias_case(monkeypatch, tmp_path, target):
    check_bias_decides(tmp_path, target)
    bug.eagle_fc_bias_dropped(monkeypatch)
    with pytest.raises(AssertionError):
        check_bias_decides(tmp_path, target)


def test_d2t_read_as_ids_fails_the_eagle3_semantics(monkeypatch, tmp_path, target):
    path = eagle3_embedding_checkpoint(tmp_path, target, 40)
    check_eagle3_drafts_previous_token(path, target)
    bug.eagle3_d2t_read_as_ids(monkeypatch)
    with pytest.raises(AssertionError):
        check_eagle3_drafts_previous_token(path, target)


def test_kept_guesses_fail_the_advance_check(monkeypatch, tmp_path, target):
    check_advance_replaces_guesses(tmp_path, target)
    bug.eagle_drafts_kept_as_target_rows(monkeypatch)
    with pytest.raises(AssertionError):
        check_advance_replaces_guesses(tmp_path, target)


def test_chains_left_in_drafting_order_fail_the_together_check(monkeypatch, tmp_path, target):
    check_sequences_together_draft_as_alone(tmp_path, target, "eagle1")
    bug.eagle_batched_chains_left_ranked(monkeypatch)
    with pytest.raises(AssertionError):
        check_sequences_together_draft_as_alone(tmp_path, target, "eagle1")


def test_shared_sampling_params_fail_the_sampled_together_check(monkeypatch):
    check_sampled_chains_together_as_alone()
    bug.eagle_sampled_rows_share_the_first_params(monkeypatch)
    with pytest.raises(AssertionError):
        check_sampled_chains_together_as_alone()


def test_tree_rows_seeing_every_row_fail_the_reference(monkeypatch, tmp_path, target):
    check_tree_matches_reference(tmp_path, target, "eagle3")
    bug.eagle_tree_rows_see_every_fed_row(monkeypatch)
    with pytest.raises(AssertionError):
        check_tree_matches_reference(tmp_path, target, "eagle3")


def test_scratch_over_the_root_fails_the_reference(monkeypatch, tmp_path, target):
    check_tree_matches_reference(tmp_path, target, "eagle1")
    bug.eagle_scratch_over_the_root(monkeypatch)
    with pytest.raises(AssertionError):
        check_tree_matches_reference(tmp_path, target, "eagle1")


@pytest.mark.parametrize("seeded", [False, True])
def test_a_q_other_than_the_sampled_one_fails_the_sampling_check(monkeypatch, seeded):
    seq = eagle3_sequence(PROMPT_TOKENS)
    bug.eagle_q_is_not_the_sampled_one(monkeypatch)
    with pytest.raises(AssertionError):
        check_tokens_come_from_the_q_sent(seq, seeded, n=400)


def test_a_dropped_norm_before_residual_fails_the_library_reference(monkeypatch):
    check_library_head_scores_as_the_library()
    bug.speculators_norm_before_residual_dropped(monkeypatch)
    with pytest.raises(AssertionError):
        check_library_head_scores_as_the_library()


@pytest.mark.parametrize("name", ["eagle1", "eagle3"])
def test_swapped_k_and_v_fail_the_published_twin(monkeypatch, tmp_path, target, name):
    check_speculators_loads_as_published(tmp_path / "right", target, name)
    bug.speculators_k_and_v_swapped(monkeypatch)
    with pytest.raises(AssertionError):
        check_speculators_loads_as_published(tmp_path / "wrong", target, name)


def test_swapped_k_and_v_fail_the_library_reference(monkeypatch):
    bug.speculators_k_and_v_swapped(monkeypatch)
    with pytest.raises(AssertionError):
        check_library_head_scores_as_the_library()
