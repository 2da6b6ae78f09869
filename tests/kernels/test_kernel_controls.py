"""Negative controls for the kernels' invariant tests: each guarding check passes on the real
kernel and fails on its planted bug (tests/planted_bugs.py)."""

from __future__ import annotations

import planted_bugs as bug
import pytest
import torch
from test_convergence import check_every_position_converges, check_first_token_converges
from test_int8_dot import _weight, check_within_the_per_column_bound
from test_linear import check_rows_independent_of_their_call
from test_rejection import check_seeded_output_ignores_drafts

from kernels.linear import PackedLinear, available, batch_invariant


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


@pytest.mark.skipif(not batch_invariant("fp16-dot"), reason="no fp16-dot kernel on this CPU")
def test_the_row_check_fails_on_a_kernel_whose_row_depends_on_the_row_count(monkeypatch):
    """fp16-dot handing calls of several rows to other code (as FBGEMM's micro-kernel treats a
    remainder of rows) fails the batch-invariance check of tests/kernels/test_linear.py."""
    check_rows_independent_of_their_call("fp16-dot", 1)  # the real kernel passes
    bug.fp16_dot_rows_change_with_the_row_count(monkeypatch)
    with pytest.raises(AssertionError):
        check_rows_independent_of_their_call("fp16-dot", 1)


@pytest.mark.skipif(not available("int8-dot"), reason="no int8-dot kernel on this CPU")
def test_the_row_check_fails_on_an_int8_product_whose_row_depends_on_the_row_count(monkeypatch):
    check_rows_independent_of_their_call("int8-dot", 1)  # the real kernel passes
    bug.int8_dot_rows_change_with_the_row_count(monkeypatch)
    with pytest.raises(AssertionError):
        check_rows_independent_of_their_call("int8-dot", 1)


@pytest.mark.skipif(not available("int8-dot"), reason="no int8-dot kernel on this CPU")
def test_the_bound_check_fails_on_one_scale_for_the_whole_weight(monkeypatch):
    """tests/kernels/test_int8_dot.py's quality check catches a scale that is not per column."""
    w = _weight(300, 640, seed=1)
    x = torch.randn(6, 640)
    check_within_the_per_column_bound(x, w, PackedLinear(w, None, "int8-dot")(x))
    bug.int8_scale_per_tensor(monkeypatch)
    with pytest.raises(AssertionError):
        check_within_the_per_column_bound(x, w, PackedLinear(w, None, "int8-dot")(x))
