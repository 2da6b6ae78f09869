"""EAGLE heads in the speculators format (vllm-project/speculators; splitspec/speculators_format.py
reads them for verifier_service/methods/eagle/checkpoint.py):

- a head the speculators library itself saved (tests/fixtures/speculators-eagle3: EAGLE-3, a
  draft vocabulary, norm_before_residual true) loads, and its head scores every row as the
  library's own forward did (the fixture's reference logits), and drafts what the same tensors
  written in the published format draft;
- heads written here in the speculators format from the published formats' cases (EAGLE-1/2
  with and without an fc bias, EAGLE-3 with a draft vocabulary, with norm_before_residual, with
  the whole vocabulary and its own embedding) load into the same spec and tensors as the
  published checkpoint, and draft the reference's chains;
- keys a speculators config may leave out read as LlamaConfig's defaults and vLLM's;
- what the head cannot serve is refused with the key named, and a head made for another
  verifier is refused with the verifier's key and name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from eagle_testlib import (
    HEAD_DIM,
    HEADS,
    INTER,
    KV,
    VOCAB,
    H,
    ReferenceHead,
    config,
    random_weights,
    speculators_config,
    speculators_tensors,
    write_checkpoint,
    write_speculators_checkpoint,
)
from safetensors.torch import load_file
from test_eagle_format import PROMPT, case_checkpoint, head_for, rows

from splitspec import speculators_format
from verifier_service.methods.eagle.checkpoint import EagleSpec, load, misfit
from verifier_service.methods.eagle.head import EagleHead

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "speculators-eagle3"


@pytest.fixture(scope="module")
def target():
    from eagle_testlib import tiny_target

    return tiny_target(seed=1)


def without_verifier(spec: EagleSpec) -> EagleSpec:
    import dataclasses

    return dataclasses.replace(spec, verifier=())


def identity_if_none(ids: torch.Tensor | None, n: int) -> torch.Tensor:
    return torch.arange(n) if ids is None else ids


def check_same_head(a, b) -> None:
    """Two loaded heads (spec, weights) are one head: the same spec (but for the verifier a
    speculators head names) and tensors, the same draft-to-target map."""
    (spec_a, w_a), (spec_b, w_b) = a, b
    assert without_verifier(spec_a) == without_verifier(spec_b)
    ta = {k: v for k, v in w_a.tensors().items() if k not in ("d2t", "t2d")}
    tb = {k: v for k, v in w_b.tensors().items() if k not in ("d2t", "t2d")}
    assert ta.keys() == tb.keys()
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name
    n = spec_a.draft_vocab_size
    assert torch.equal(identity_if_none(w_a.draft_to_target(), n),
                       identity_if_none(w_b.draft_to_target(), n))


# --------------------------------------------------------------------------- the library's own head


def fixture_copy(tmp_path: Path, **config_change) -> Path:
    """The library-written head, its config.json changed by `config_change` (None: removed)."""
    path = tmp_path / "library-head"
    shutil.copytree(FIXTURE, path)
    cfg = json.loads((path / "config.json").read_text())
    for key, value in config_change.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def check_library_head_scores_as_the_library(path: Path = FIXTURE) -> None:
    """Every row's draft-vocabulary logits, the rows advanced one at a time, are the ones the
    speculators library's own forward gave for the same input (float32 there, float64 here)."""
    spec, weights = load(path)
    ref = load_file(str(FIXTURE / "reference.safetensors"))
    head = EagleHead(spec, weights, weights.embed, dtype=torch.float64)
    seq = head.new_sequence(4)
    for i in range(ref["input_ids"].shape[0]):
        seq.advance(ref["hidden_states"][i:i + 1].double(), ref["input_ids"][i:i + 1])
        torch.testing.assert_close(seq.root_logits, ref["logits"][i].double(),
                                   atol=2e-5, rtol=1e-5)


def test_the_library_written_head_loads_as_written():
    spec, w = load(FIXTURE)
    assert (spec.version, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
            spec.intermediate_size) == (3, 16, 2, 1, 8, 32)
    assert (spec.vocab_size, spec.draft_vocab_size, spec.target_hidden_size) == (48, 24, 16)
    assert spec.norm_before_residual and spec.aux_layer_ids == (0, 2, 4)
    assert spec.rms_norm_eps == 1e-5 and spec.rope_theta == 10000.0
    assert dict(spec.verifier) == {"name_or_path": "tiny-llama-target"}
    stored = load_file(str(FIXTURE / "model.safetensors"))
    assert torch.equal(w.q, stored["layers.0.self_attn.q_proj.weight"])
    assert torch.equal(w.hidden_norm, stored["layers.0.hidden_norm.weight"])
    assert torch.equal(w.draft_to_target(), torch.arange(24) + stored["d2t"])


def test_the_library_written_head_scores_as_the_library():
    check_library_head_scores_as_the_library()


def test_the_library_written_head_is_its_published_twin(tmp_path):
    """The same tensors written in the published EAGLE-3 format (midlayer.*, the one-layer
    Llama config) load into the same head, and draft the same chain."""
    scfg = json.loads((FIXTURE / "config.json").read_text())
    layer = scfg["transformer_layer_config"]
    cfg = {k: layer[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                 "num_attention_heads", "num_key_value_heads", "head_dim",
                                 "rms_norm_eps", "max_position_embeddings")}
    cfg |= {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
            "rope_theta": 10000.0, "draft_vocab_size": 24, "target_hidden_size": 16,
            "norm_before_residual": True, "eagle_aux_hidden_state_layer_ids": [0, 2, 4]}
    stored = load_file(str(FIXTURE / "model.safetensors"))
    published = write_checkpoint(tmp_path / "published", cfg, {
        k.replace("layers.0.", "midlayer."): v for k, v in stored.items()})
    ours, theirs = load(FIXTURE), load(published)
    check_same_head(ours, theirs)
    ref = load_file(str(FIXTURE / "reference.safetensors"))
    chains = []
    for spec, w in (ours, theirs):
        seq = EagleHead(spec, w, w.embed, dtype=torch.float64).new_sequence(16)
        seq.advance(ref["hidden_states"].double(), ref["input_ids"])
        chains.append(seq.chain(4).tolist())
    assert chains[0] == chains[1]


# --------------------------------------------------------------------------- written here


CASES = ["eagle1", "eagle1-bias-bin", "eagle3", "eagle3-norm-before-residual",
         "eagle3-full-vocab-embed"]


def check_speculators_loads_as_published(tmp_path, model, name) -> None:
    """A case's head written in the speculators format loads into the published checkpoint's
    spec and tensors, and drafts the reference's chain."""
    version, w, cfg, published = case_checkpoint(tmp_path, name)
    path = write_speculators_checkpoint(tmp_path / f"speculators-{name}", cfg, w, version)
    check_same_head(load(path), load(published))
    head = head_for(path, model, dtype=torch.float64)
    nxt, feats, _ = rows(model, PROMPT, version)
    seq = head.new_sequence(8)
    seq.advance(feats, torch.tensor(nxt))
    assert seq.chain(4).tolist() == ReferenceHead(version, w, model, cfg).chain(nxt, feats, 4)


@pytest.mark.parametrize("name", CASES)
def test_a_speculators_head_is_its_published_twin(tmp_path, target, name):
    check_speculators_loads_as_published(tmp_path, target, name)


def test_the_speculators_names_are_the_documented_ones(tmp_path):
    """The writer here follows the library's names (its converters': fc -> fusion_fc and
    layers.0 -> transformer for EAGLE-1/2, midlayer -> layers.0 for EAGLE-3)."""
    e1 = speculators_tensors(random_weights(1, seed=3, bias=True), 1)
    assert {"fusion_fc.weight", "fusion_fc.bias", "transformer.self_attn.q_proj.weight",
            "transformer.mlp.down_proj.weight"} <= e1.keys()
    assert not any(k.startswith(("fc.", "layers.")) for k in e1)
    e3 = speculators_tensors(random_weights(3, seed=3, draft_vocab=48), 3)
    assert {"fc.weight", "layers.0.hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t",
            "t2d"} <= e3.keys()


def test_kv_heads_and_head_dim_are_the_layer_configs(tmp_path):
    spec, _ = load(write_speculators_checkpoint(tmp_path / "e3", config(3, 48),
                                                random_weights(3, seed=1, draft_vocab=48), 3))
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.intermediate_size) == (
        HEADS, KV, HEAD_DIM, INTER)


# --------------------------------------------------------------------------- defaults


def test_llama_defaults_are_transformers_llama_config():
    from transformers import LlamaConfig

    defaults = LlamaConfig().to_dict()
    theta = (defaults.get("rope_parameters") or {}).get("rope_theta", defaults.get("rope_theta"))
    for key, value in speculators_format.LLAMA_DEFAULTS.items():
        assert (theta if key == "rope_theta" else defaults[key]) == value, key


def test_keys_left_out_read_as_llama_config_and_vllm(tmp_path):
    """A transformer_layer_config written as a diff leaves out LlamaConfig's defaults
    (rms_norm_eps 1e-6, rope_theta 10000, num_key_value_heads = heads); an EAGLE-3 config
    without norm_before_residual reads it true and without draft_vocab_size the whole
    vocabulary, as vLLM does."""
    w = random_weights(3, seed=4)  # the whole vocabulary as the draft vocabulary
    cfg = config(3, num_key_value_heads=HEADS)
    w["midlayer.self_attn.k_proj.weight"] = torch.zeros(HEADS * HEAD_DIM, 2 * H)
    w["midlayer.self_attn.v_proj.weight"] = torch.zeros(HEADS * HEAD_DIM, 2 * H)
    scfg = speculators_config(cfg, 3)
    for key in ("rms_norm_eps", "rope_theta", "num_key_value_heads"):
        scfg["transformer_layer_config"].pop(key)
    for key in ("norm_before_residual", "draft_vocab_size", "target_hidden_size"):
        scfg.pop(key)
    spec, _ = load(write_checkpoint(tmp_path / "diff", scfg, speculators_tensors(w, 3)))
    assert (spec.rms_norm_eps, spec.rope_theta, spec.num_kv_heads) == (1e-6, 10000.0, HEADS)
    assert spec.norm_before_residual
    assert (spec.draft_vocab_size, spec.target_hidden_size) == (VOCAB, H)


def test_rope_parameters_and_scaling_are_read(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    scfg = speculators_config(config(3, 48), 3)
    scfg["transformer_layer_config"].pop("rope_theta")
    scfg["transformer_layer_config"]["rope_parameters"] = {"rope_theta": 50000.0, **scaling}
    w = speculators_tensors(random_weights(3, seed=2, draft_vocab=48), 3)
    spec, _ = load(write_checkpoint(tmp_path / "rope", scfg, w))
    assert spec.rope_theta == 50000.0 and dict(spec.rope_scaling) == scaling


def test_the_default_proposal_methods_tokens_are_read():
    scfg = speculators_config(config(3, 48), 3)
    assert speculators_format.speculative_tokens(scfg) == 3
    assert speculators_format.speculative_tokens(config(3, 48)) is None


# --------------------------------------------------------------------------- refusals


def _layer(key, value):
    return lambda cfg, w: cfg["transformer_layer_config"].__setitem__(key, value)


def _spec(key, value):
    return lambda cfg, w: cfg["speculators_config"].__setitem__(key, value)


def _verifier(key, value):
    return lambda cfg, w: cfg["speculators_config"]["verifier"].__setitem__(key, value)


@pytest.mark.parametrize("change,match", [
    (lambda cfg, w: cfg.__setitem__("speculators_model_type", "mlp"), "speculators_model_type"),
    (lambda cfg, w: cfg.__setitem__("speculators_model_type", "dflash"),
     "speculators_model_type 'dflash'"),
    (_spec("algorithm", "medusa"), "speculators_config.algorithm 'medusa'"),
    (lambda cfg, w: cfg.pop("speculators_config"), "speculators_config must be an object"),
    (lambda cfg, w: cfg.pop("transformer_layer_config"), "transformer_layer_config must be"),
    (_layer("model_type", "qwen3"), "transformer_layer_config.model_type 'qwen3'"),
    (_layer("num_hidden_layers", 2), "transformer_layer_config.num_hidden_layers 2"),
    (_layer("mlp_bias", True), "transformer_layer_config.mlp_bias"),
    (_layer("hidden_act", "gelu"), "hidden_act"),
    (lambda cfg, w: cfg.__setitem__("norm_before_fc", True), "norm_before_fc true"),
    (lambda cfg, w: cfg.__setitem__("fc_norm", True), "fc_norm true"),
    (lambda cfg, w: cfg.__setitem__("norm_output", True), "norm_output true"),
    (_verifier("hidden_size", 2 * H), "speculators_config.verifier.hidden_size is 128"),
    (_verifier("vocab_size", VOCAB + 1), "speculators_config.verifier.vocab_size is 97"),
    (_verifier("vocab_size", "many"), "speculators_config.verifier.vocab_size must be"),
    (lambda cfg, w: w["embed_tokens.weight"].fill_(float("nan")), "embed_tokens.weight holds NaN"),
    (lambda cfg, w: w.__setitem__("layers.1.mlp.up_proj.weight", torch.zeros(1)), "unexpected"),
    (lambda cfg, w: cfg.__setitem__("draft_vocab_size", 50), "lm_head: shape"),
])
def test_what_an_eagle3_head_cannot_serve_is_refused_by_key(tmp_path, change, match):
    cfg = speculators_config(config(3, 48), 3)
    w = speculators_tensors(random_weights(3, seed=8, draft_vocab=48, embed=True), 3)
    change(cfg, w)
    with pytest.raises(ValueError, match=match):
        load(write_checkpoint(tmp_path / "bad", cfg, w))


@pytest.mark.parametrize("change,match", [
    (_spec("algorithm", "eagle3"), "speculators_config.algorithm 'eagle3'"),
    (lambda cfg, w: cfg.__setitem__("layernorms", True), "layernorms true"),
    (lambda cfg, w: cfg.__setitem__("transformer_layer_architecture", "MistralDecoderLayer"),
     "transformer_layer_architecture 'MistralDecoderLayer'"),
    (lambda cfg, w: cfg.__setitem__("fusion_bias", True), "no fusion_fc.bias"),
    (lambda cfg, w: w.__setitem__("fusion_fc.bias", torch.zeros(H)), "fusion_bias false"),
    (lambda cfg, w: w.__setitem__("embedding_layernorm.weight", torch.ones(H)), "unexpected"),
])
def test_what_an_eagle1_head_cannot_serve_is_refused_by_key(tmp_path, change, match):
    cfg = speculators_config(config(1), 1)
    w = speculators_tensors(random_weights(1, seed=8), 1)
    change(cfg, w)
    with pytest.raises(ValueError, match=match):
        load(write_checkpoint(tmp_path / "bad", cfg, w))


def test_eagle_algorithms_of_the_same_layer_are_served(tmp_path):
    for algorithm in ("eagle2", "hass"):
        cfg = speculators_config(config(1), 1)
        cfg["speculators_config"]["algorithm"] = algorithm
        spec, _ = load(write_checkpoint(tmp_path / algorithm, cfg,
                                        speculators_tensors(random_weights(1, seed=8), 1)))
        assert spec.version == 1


def test_a_head_made_for_another_verifier_names_it(tmp_path):
    cfg = speculators_config(config(3, 48), 3)
    cfg["speculators_config"]["verifier"] |= {"name_or_path": "org/other-8b",
                                              "hidden_size": H, "vocab_size": VOCAB}
    w = speculators_tensors(random_weights(3, seed=8, draft_vocab=48), 3)
    spec, _ = load(write_checkpoint(tmp_path / "made-for", cfg, w))
    assert dict(spec.verifier) == {"name_or_path": "org/other-8b", "hidden_size": H,
                                   "vocab_size": VOCAB}
    target = {"vocab_size": VOCAB, "hidden_size": H, "num_hidden_layers": 30}
    assert misfit(spec, target) is None
    why = misfit(spec, target | {"hidden_size": 2 * H})
    assert "speculators_config.verifier.hidden_size is 64" in why and "org/other-8b" in why
    why = misfit(spec, target | {"vocab_size": 100})
    assert "speculators_config.verifier.vocab_size is 96" in why and "org/other-8b" in why


def test_a_head_without_verifier_sizes_still_names_its_verifier(tmp_path):
    path = write_speculators_checkpoint(tmp_path / "e1", config(1),
                                        random_weights(1, seed=8), 1)
    spec, _ = load(path)
    why = misfit(spec, {"vocab_size": 100, "hidden_size": H, "num_hidden_layers": 6})
    assert "vocabulary is 96 tokens" in why and "tiny-llama-target" in why


# --------------------------------------------------------------------------- elsewhere


def test_a_speculators_head_from_its_config_alone(tmp_path):
    """--load-format dummy reads a speculators config into the same shapes."""
    from verifier_service.methods.eagle import dummy as eagle_dummy

    shutil.copy(FIXTURE / "config.json", tmp_path / "config.json")
    spec, w = eagle_dummy.load(tmp_path, "dummy", seed=1)
    real, _ = load(FIXTURE)
    assert without_verifier(spec) == without_verifier(real)
    assert w.lm_head.shape == (24, 16) and w.fc.shape == (16, 48)


def test_the_launcher_finds_a_speculators_head_that_fits(tmp_path):
    from splitspec.methods import METHODS

    fits = METHODS["eagle"].fits
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"vocab_size": 48, "hidden_size": 16}))
    assert fits(target, FIXTURE)
    (target / "config.json").write_text(json.dumps({"vocab_size": 48, "hidden_size": 32}))
    assert not fits(target, FIXTURE)
    bad = fixture_copy(tmp_path, norm_output=True)
    (target / "config.json").write_text(json.dumps({"vocab_size": 48, "hidden_size": 16}))
    assert not fits(target, bad)
