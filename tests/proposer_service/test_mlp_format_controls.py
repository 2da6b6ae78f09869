"""Negative control for the format test: a speculator whose norms are read as mean-centred
LayerNorms (tests/planted_bugs.py) drafts other tokens than the format defines, and the format
test says so."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from test_mlp_format import check_drafts_match_the_reference, random_checkpoint, write_checkpoint


@pytest.mark.parametrize("scale_input", [False, True], ids=["raw-input", "scale-input"])
def test_the_format_test_fails_on_a_mean_centred_norm(monkeypatch, tmp_path, scale_input):
    cfg, w = random_checkpoint(tie=True, scale_input=scale_input, seed=5)
    path = write_checkpoint(tmp_path / "spec", cfg, w, prefix=True)
    check_drafts_match_the_reference(path, cfg, w, seed=5)  # faithful: passes
    bug.speculator_norm_mean_centred(monkeypatch)
    with pytest.raises(AssertionError):
        check_drafts_match_the_reference(path, cfg, w, seed=5)
