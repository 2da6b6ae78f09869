"""The EAGLE heads shipped next to their targets (`make models-eagle`) load through the
verifier's loader, fit their targets, are fp16 files under 64 MB, carry their model card, and
draft the toy target's own continuations of held-out code better than chance.

Skipped where a head is not there (training it takes hours: docs/models.md) or, for the real
model's, where the real model is not imported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
sys.path.insert(0, str(REPO / "scripts"))

HEADS = {"toy": (MODELS / "target", MODELS / "target-eagle"),
         "real": (MODELS / "smollm2-135m-instruct",
                  MODELS / "smollm2-135m-instruct-eagle")}


def _present(family: str):
    target, head = HEADS[family]
    if not (head / "config.json").exists():
        pytest.skip(f"{head} not trained (make models-eagle)")
    if not (target / "config.json").exists():
        pytest.skip(f"{target} not imported")
    return target, head


@pytest.mark.parametrize("family", sorted(HEADS))
def test_the_head_loads_and_fits_its_target(family):
    from safetensors import safe_open

    from verifier_service.methods.eagle.checkpoint import MAX_FILE_BYTES, load, misfit

    target, head = _present(family)
    spec, _ = load(head)
    assert misfit(spec, json.loads((target / "config.json").read_text())) is None
    assert spec.version == 3
    weights = head / "model.safetensors"
    assert weights.stat().st_size <= MAX_FILE_BYTES
    with safe_open(str(weights), framework="pt") as f:
        floats = {f.get_slice(k).get_dtype() for k in f.keys() if k not in ("d2t", "t2d")}
    assert floats == {"F16"}
    assert (head / "README.md").exists() and (head / "eval.json").exists()


def test_the_toy_head_drafts_the_targets_continuations():
    import eagle_data as ed
    import model_family as mf
    from transformers import AutoModelForCausalLM

    from verifier_service.methods.eagle.head import EagleHead

    target_dir, head_dir = _present("toy")
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    tok = mf.load_tokenizer(target_dir)
    texts = [d["text"] for d in json.loads((MODELS / "heldout-sample.json").read_text())]
    windows = [w[:64].tolist() for w in mf.sample_windows(tok, texts, 64)[:4]]
    head = EagleHead.from_dir(head_dir, model.model.embed_tokens.weight.detach())
    layers = list(head.spec.feature_layers(model.config.num_hidden_layers))
    ids = torch.tensor(windows)
    tokens, feats, _, _, _ = ed.greedy_with_features(model, ids, torch.ones_like(ids), 24,
                                                     layers, 1, set())
    hits = total = 0
    for b in range(len(windows)):
        f, t = feats[b].reshape(feats.shape[1], -1), tokens[b]
        seq = head.new_sequence(128)
        seq.advance(f[:63], t[1:64])  # rows 0..62: the root row 62 drafts t[64]
        for j in range(62, t.shape[0] - 2):  # root row j drafts t[j + 2]
            if j > 62:
                seq.advance(f[j:j + 1], t[j + 1:j + 2])
            hits += int(seq.chain(1)[0]) == int(t[j + 2])
            total += 1
    assert hits / total > 0.3, hits / total
