"""The shipped model family in models/ is trained (not random), consistent and small.

Thresholds come from models/eval.json, written by scripts/eval_models.py (the model card's source);
each is the value measured there plus a margin, and far below a random model's ln(vocab).
"""

import json
import math
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
sys.path.insert(0, str(REPO / "scripts"))

import model_family as mf  # noqa: E402

pytestmark = pytest.mark.skipif(not (MODELS / "eval.json").exists(), reason="models/ not built (make models)")


@pytest.fixture(scope="module")
def card():
    return json.loads((MODELS / "eval.json").read_text())


@pytest.fixture(scope="module")
def tokenizer():
    return mf.load_tokenizer(MODELS / "target")


@pytest.fixture(scope="module")
def sample(tokenizer):
    texts = [d["text"] for d in json.loads((MODELS / "heldout-sample.json").read_text())]
    return texts, mf.sample_windows(tokenizer, texts)


@pytest.fixture(scope="module")
def lms():
    from transformers import AutoModelForCausalLM

    return {
        name: AutoModelForCausalLM.from_pretrained(str(MODELS / name), local_files_only=True, dtype=torch.float32).eval()
        for name in ("target", "draft")
    }


def test_total_size_under_60mb():
    total = sum(p.stat().st_size for p in MODELS.rglob("*") if p.is_file())
    assert total < 60 * 1024 * 1024, f"models/ is {total / 2**20:.1f} MiB"


def test_weights_are_half_precision():
    from safetensors import safe_open

    for name in ("target", "draft", "mlp-speculator"):
        with safe_open(str(MODELS / name / "model.safetensors"), framework="pt") as f:
            dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
        assert dtypes <= {"F16", "BF16"}, (name, dtypes)


@pytest.mark.parametrize("name", ["target", "draft"])
def test_heldout_loss_below_card_threshold(name, lms, sample, card):
    threshold = card[name]["sample_loss_threshold"]
    assert threshold < math.log(card["vocab_size"]) - 2  # the bar itself is far from random
    loss = mf.lm_loss(lms[name], sample[1])
    assert loss < threshold, f"{name}: held-out sample loss {loss:.3f} >= {threshold}"


def test_family_shares_one_tokenizer(tokenizer, lms):
    from proposer_service.mlp_speculator import MLPSpeculatorConfig

    fp = mf.vocab_fingerprint(tokenizer)
    assert mf.vocab_fingerprint(mf.load_tokenizer(MODELS / "draft")) == fp
    spec_cfg = json.loads((MODELS / "mlp-speculator" / "config.json").read_text())
    assert MLPSpeculatorConfig.from_dict(spec_cfg).target_vocab_fingerprint == fp
    assert spec_cfg["vocab_size"] == len(tokenizer) == lms["target"].config.vocab_size == lms["draft"].config.vocab_size
    assert spec_cfg["emb_dim"] == lms["target"].config.hidden_size
    eos = tokenizer.convert_tokens_to_ids(mf.EOS)
    for m in lms.values():
        assert m.config.eos_token_id == eos and m.config.bos_token_id == eos


def test_tokenizer_round_trips_python_source(tokenizer, sample):
    snippet = 'def f(x):\n\tif x:  # ünïcode, émoji 🐍\n        return {"a": [1, 2]}\r\n\n\n    pass\n'
    for text in [snippet, *sample[0]]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    eos = tokenizer.convert_tokens_to_ids(mf.EOS)
    assert tokenizer.encode(mf.EOS, add_special_tokens=False) == [eos]


def test_mlp_speculator_head1_accuracy(lms, sample, card):
    from proposer_service.mlp_speculator import MLPSpeculator

    spec = MLPSpeculator.from_pretrained(MODELS / "mlp-speculator", dtype=torch.float32)
    acc = mf.mlp_head_accuracy(lms["target"], spec, sample[1])
    assert acc[0] > card["mlp"]["sample_head1_threshold"], acc


def test_card_reports_a_learned_proposer_at_0_6(card):
    table = card["acceptance"]["table"]
    assert set(table) == {"ngram", "draft", "mlp"}
    assert max(table[name][4]["acceptance_rate"] for name in ("draft", "mlp")) >= 0.6


def test_split_reproduces_on_the_same_python():
    shipped = json.loads((MODELS / "split.json").read_text())
    here = mf.split_manifest(mf.CorpusConfig())
    if here["python"] != shipped["python"] or here["n_train_files"] + here["n_heldout_files"] != (
        shipped["n_train_files"] + shipped["n_heldout_files"]
    ):
        pytest.skip("different standard library here; the split is only reproducible on the same one")
    assert here["heldout_files_sha256"] == shipped["heldout_files_sha256"]
