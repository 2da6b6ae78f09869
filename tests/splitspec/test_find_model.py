"""The launcher finds a speculator next to its target: `<target>-<dir>` (fitted to that target)
before the family's `<dir>`, and only one that fits."""

from __future__ import annotations

import json

from splitspec.methods import METHODS, find_model


def _model(path, tokenizer: str, **config):
    path.mkdir()
    (path / "tokenizer.json").write_text(tokenizer)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_fitted_draft_beats_the_familys_and_a_misfit_is_skipped(tmp_path):
    target = _model(tmp_path / "chat", "A", hidden_size=8, vocab_size=10)
    draft = METHODS["draft"]
    assert find_model(draft, target) is None
    family = _model(tmp_path / "draft", "A")
    assert find_model(draft, target) == str(family)
    fitted = _model(tmp_path / "chat-draft", "A")
    assert find_model(draft, target) == str(fitted)
    (fitted / "tokenizer.json").write_text("B")  # another vocabulary: not this target's
    assert find_model(draft, target) == str(family)


def test_a_speculator_must_match_the_targets_width_and_vocabulary(tmp_path):
    target = _model(tmp_path / "chat", "A", hidden_size=8, vocab_size=10)
    mlp = METHODS["mlp"]
    _model(tmp_path / "chat-mlp-speculator", "A", emb_dim=8, vocab_size=10)
    assert find_model(mlp, target) == str(tmp_path / "chat-mlp-speculator")
    _model(tmp_path / "mlp-speculator", "A", emb_dim=4, vocab_size=10)
    (tmp_path / "chat-mlp-speculator" / "config.json").write_text('{"emb_dim": 4}')
    assert find_model(mlp, target) is None


def test_an_eagle_head_must_name_the_targets_vocabulary_and_feature_width(tmp_path):
    target = _model(tmp_path / "chat", "A", hidden_size=8, vocab_size=10)
    eagle = METHODS["eagle"]
    head = _model(tmp_path / "chat-eagle", "A", hidden_size=8, vocab_size=10)
    assert find_model(eagle, target) == str(head)  # features as wide as its own hidden state
    (head / "config.json").write_text(json.dumps(
        {"hidden_size": 4, "target_hidden_size": 8, "vocab_size": 10}))
    assert find_model(eagle, target) == str(head)  # a narrower head over the target's width
    (head / "config.json").write_text(json.dumps({"hidden_size": 8, "vocab_size": 12}))
    assert find_model(eagle, target) is None


def test_the_shipped_toy_head_is_found_beside_its_target():
    assert find_model(METHODS["eagle"], "models/target") == "models/target-eagle"
