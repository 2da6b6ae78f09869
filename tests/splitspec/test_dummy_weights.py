"""--load-format dummy: a model from config.json alone, its weights a function of the seed (equal
for one seed, different across seeds), on the weights' device; the byte-level fallback tokenizer;
an EAGLE head of a config's shape. Shapes: models/shapes/tiny-llama (no weights, no tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from splitspec.dummy_weights import byte_tokenizer, placeholder
from splitspec.lean_llama import LeanDecoder
from splitspec.modelio import load_causal_lm, load_tokenizer, tokenizer_fingerprint

SHAPES = Path(__file__).resolve().parents[2] / "models" / "shapes"
TINY = SHAPES / "tiny-llama"
CPU = torch.device("cpu")


def dummy(seed: int, dtype=torch.float32):
    return load_causal_lm(TINY, CPU, dtype, load_format="dummy", seed=seed)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def check_deterministic_per_seed() -> None:
    a, b, c = weights(dummy(3)), weights(dummy(3)), weights(dummy(4))
    assert a.keys() == c.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert all(not torch.equal(a[n], c[n]) for n in a if a[n].numel() > 1)


def test_one_seed_one_model_another_seed_another():
    check_deterministic_per_seed()


def test_the_check_catches_weights_that_ignore_the_seed(monkeypatch):
    import planted_bugs as bug

    bug.dummy_weights_ignore_the_seed(monkeypatch)
    with pytest.raises(AssertionError):
        check_deterministic_per_seed()


def test_a_dummy_model_has_the_configs_shape_and_dtype_and_small_finite_outputs():
    model = dummy(0, torch.bfloat16)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (64, 4, 512)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert all(float(p.detach().abs().max()) <= 1e-3 for p in model.parameters())
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 512) and bool(logits.isfinite().all())
    assert LeanDecoder.supports(model)


def test_no_weight_file_is_needed_and_a_real_load_still_wants_one():
    assert not list(TINY.glob("*.safetensors"))
    from splitspec.errors import BadModel
    with pytest.raises(BadModel):
        load_causal_lm(TINY, CPU, torch.float32)


def test_the_byte_tokenizer_round_trips_text_and_names_the_other_ids():
    tok = load_tokenizer(TINY, load_format="dummy")
    assert len(tok) == 512
    text = "def f(x):\n    return 'héllo' ✓"
    ids = tok.encode(text)
    assert ids == list(text.encode()) and tok.decode(ids) == text
    assert tok.decode([300, 511]) == placeholder(300) + placeholder(511)
    assert tok.eos_token_id == 2  # the config's


def test_the_byte_tokenizer_is_a_function_of_the_vocabulary_size():
    """A dummy draft and a dummy target of one vocabulary agree (the verifier accepts the pair);
    of two sizes, they do not."""
    one, two, other = byte_tokenizer(600), byte_tokenizer(600), byte_tokenizer(601)
    assert tokenizer_fingerprint(one) == tokenizer_fingerprint(two)
    assert tokenizer_fingerprint(one) != tokenizer_fingerprint(other)


def test_an_eagle_head_from_its_config_alone_is_seeded_and_checked():
    from verifier_service.methods.eagle import dummy as eagle_dummy

    spec, w = eagle_dummy.load(SHAPES / "tiny-llama-eagle3", "dummy", seed=5)
    _, same = eagle_dummy.load(SHAPES / "tiny-llama-eagle3", "dummy", seed=5)
    _, other = eagle_dummy.load(SHAPES / "tiny-llama-eagle3", "dummy", seed=6)
    assert (spec.version, spec.hidden_size, spec.draft_vocab_size) == (3, 64, 256)
    assert torch.equal(w.q, same.q) and not torch.equal(w.q, other.q)
    assert torch.equal(w.draft_to_target(), torch.arange(256))


@pytest.mark.parametrize("shape, params_b", [("llama-3.2-1b", 1.24), ("llama-3.1-8b", 8.03),
                                              ("qwen2.5-7b", 7.62)])
def test_the_shipped_shapes_are_the_published_models_sizes(shape, params_b):
    """The shipped configs describe the published models: their parameter counts (from the
    config arithmetic, nothing built) match the model cards' to 1%."""
    import json

    from splitspec.dummy_weights import parameter_count

    cfg = json.loads((SHAPES / shape / "config.json").read_text())
    assert parameter_count(cfg) / 1e9 == pytest.approx(params_b, rel=0.01)
