"""EAGLE-1/2 and EAGLE-3 checkpoints, written here the way the published ones are (a one-layer
Llama config.json; safetensors or pytorch_model.bin; `layers.0.*` / `midlayer.*` names, an
optional `model.` prefix), load and draft what each format's definition says:

- semantic cases whose outcome follows from the definition alone (zeroed attention and MLP
  output projections leave the layer's output equal to its input):
    EAGLE-1, fc = [0 | I]: the head's state is the target's final state, scored by the target's
      head: it drafts the token the target just emitted, again and again;
    EAGLE-1, fc = 0 with a bias: the bias alone decides (fc.bias is part of the format);
    EAGLE-1 with its own embed_tokens, fc = [I | 0], tied target: it drafts the token its own
      embedding row stands for;
    EAGLE-3, feature layers [0, 2, 4] and fc = [I | 0 | 0]: the state is the input of the
      target's layer 0, the embedding of the token before the one just emitted; an lm_head made
      of the target's embedding rows for a permuted draft vocabulary drafts that token, mapped
      back through d2t's offsets;
- the plain-tensor forward (cached, batched rows) drafts the same chains and EAGLE-2 trees as a
  reference built from transformers' Llama modules that recomputes everything from scratch;
- malformed checkpoints are refused with the field named.
"""

from __future__ import annotations

import zlib

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
    target_features,
    tiny_target,
    write_checkpoint,
)

from kernels.linear import available
from verifier_service.methods.eagle.checkpoint import load
from verifier_service.methods.eagle.head import EagleHead, advance_many, chain_many

PROMPT = [5, 17, 42, 8, 33, 61, 12, 70, 3, 25]
FEATURE_LAYERS = [0, 2, 4]


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=1)


@pytest.fixture(scope="module")
def tied_target():
    return tiny_target(seed=2, tied=True)


def head_for(path, model, **kw) -> EagleHead:
    return EagleHead.from_dir(path, model.model.embed_tokens.weight.detach(),
                              model.lm_head.weight.detach(), **kw)


def rows(model, prompt, version, layers=FEATURE_LAYERS):
    """(next tokens, features) of every prompt position, and the target's greedy token after
    the prompt: the sequence is prompt + [emitted]."""
    final, aux, greedy = target_features(model, prompt, layers if version == 3 else None)
    emitted = int(greedy[-1])
    feats = aux if version == 3 else final
    return prompt[1:] + [emitted], feats, emitted


def zero_outputs(w: dict, layer: str) -> dict:
    w[f"{layer}self_attn.o_proj.weight"].zero_()
    w[f"{layer}mlp.down_proj.weight"].zero_()
    return w


# --------------------------------------------------------------------------- semantic cases


def check_eagle1_redrafts_emitted(path, model, seed=0) -> None:
    head = head_for(path, model)
    seq = head.new_sequence(64)
    nxt, feats, emitted = rows(model, PROMPT, 1)
    seq.advance(feats, torch.tensor(nxt))
    assert seq.chain(3).tolist() == [emitted] * 3


def eagle1_identity_checkpoint(tmp_path, fmt="safetensors", prefix=""):
    w = zero_outputs(random_weights(1, seed=3), "layers.0.")
    w["fc.weight"] = torch.cat([torch.zeros(H, H), torch.eye(H)], 1)
    return write_checkpoint(tmp_path / f"e1-{fmt}{prefix}", config(1), w, fmt, prefix)


@pytest.mark.parametrize("fmt,prefix", [("safetensors", ""), ("bin", ""),
                                        ("safetensors", "model.")])
def test_eagle1_with_fc_picking_the_feature_redrafts_the_emitted_token(tmp_path, target, fmt,
                                                                       prefix):
    check_eagle1_redrafts_emitted(eagle1_identity_checkpoint(tmp_path, fmt, prefix), target)


def check_bias_decides(tmp_path, model) -> None:
    w = zero_outputs(random_weights(1, seed=4), "layers.0.")
    w["fc.weight"].zero_()
    favourite = 57
    w["fc.bias"] = model.lm_head.weight.detach()[favourite] * 4
    path = write_checkpoint(tmp_path / "e1-bias", config(1), w)
    head = head_for(path, model)
    seq = head.new_sequence(64)
    nxt, feats, _ = rows(model, PROMPT, 1)
    seq.advance(feats, torch.tensor(nxt))
    assert seq.chain(2).tolist() == [favourite] * 2


def test_eagle1_fc_bias_is_part_of_the_format(tmp_path, target):
    check_bias_decides(tmp_path, target)


def test_eagle1_own_embedding_is_used(tmp_path, tied_target):
    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(9))
    w = zero_outputs(random_weights(1, seed=5), "layers.0.")
    w["fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, H)], 1)
    # the head's row for token t is the target's row for perm[t]; tied: scored by the same rows
    w["embed_tokens.weight"] = tied_target.model.embed_tokens.weight.detach()[perm].clone()
    path = write_checkpoint(tmp_path / "e1-embed", config(1), w)
    head = head_for(path, tied_target)
    seq = head.new_sequence(64)
    nxt, feats, emitted = rows(tied_target, PROMPT, 1)
    seq.advance(feats, torch.tensor(nxt))
    assert int(seq.chain(1)[0]) == int(perm[emitted])


def eagle3_embedding_checkpoint(tmp_path, model, draft_vocab: int):
    """fc picks the first feature (the input of layer 0: the token embedding); lm_head scores
    the target's embedding rows of a draft vocabulary that keeps the prompt's tokens."""
    w = zero_outputs(random_weights(3, seed=6, draft_vocab=draft_vocab), "midlayer.")
    shuffled = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(4)).tolist()
    others = [t for t in shuffled if t not in PROMPT][: draft_vocab - len(set(PROMPT))]
    ids = torch.tensor(sorted(set(PROMPT) | set(others)))
    w["d2t"] = ids - torch.arange(draft_vocab)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    w["t2d"] = t2d
    w["fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, 2 * H)], 1)
    w["lm_head.weight"] = model.model.embed_tokens.weight.detach()[ids].clone()
    for name in ("midlayer.hidden_norm.weight", "norm.weight"):
        w[name] = torch.ones(H)
    cfg = config(3, draft_vocab, eagle_aux_hidden_state_layer_ids=FEATURE_LAYERS)
    return write_checkpoint(tmp_path / "e3-embed", cfg, w)


def check_eagle3_drafts_previous_token(path, model) -> None:
    head = head_for(path, model)
    seq = head.new_sequence(64)
    nxt, feats, _ = rows(model, PROMPT, 3)
    seq.advance(feats, torch.tensor(nxt))
    assert seq.chain(3).tolist() == [PROMPT[-1]] * 3


def test_eagle3_features_are_layer_inputs_and_d2t_offsets(tmp_path, target):
    check_eagle3_drafts_previous_token(eagle3_embedding_checkpoint(tmp_path, target, 40), target)


# --------------------------------------------------------------------------- reference forward


CASES = {
    "eagle1": (1, {}, {}),
    "eagle1-bias-bin": (1, {"bias": True}, {}),
    "eagle3": (3, {"draft_vocab": 48}, {}),
    "eagle3-norm-before-residual": (3, {"draft_vocab": 48}, {"norm_before_residual": True}),
    "eagle3-full-vocab-embed": (3, {"embed": True}, {}),
    "eagle3-target-head": (3, {}, {}),
}


def case_checkpoint(tmp_path, name):
    version, wkw, ckw = CASES[name]
    w = random_weights(version, seed=zlib.crc32(name.encode()) % 1000, **wkw)
    if name == "eagle3-target-head":  # no lm_head: the target's head scores the whole vocabulary
        for key in ("lm_head.weight", "d2t", "t2d"):
            w.pop(key)
    draft_vocab = wkw.get("draft_vocab", VOCAB)
    cfg = config(version, draft_vocab, **ckw)
    if version == 3:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": FEATURE_LAYERS,
                               "use_aux_hidden_state": True}
    fmt = "bin" if name.endswith("bin") else "safetensors"
    return version, w, cfg, write_checkpoint(tmp_path / name, cfg, w, fmt)


def check_chain_matches_reference(tmp_path, model, name, k=4) -> None:
    version, w, cfg, path = case_checkpoint(tmp_path, name)
    ref = ReferenceHead(version, w, model, cfg)
    head = head_for(path, model, dtype=torch.float64)
    nxt, feats, _ = rows(model, PROMPT, version)
    seq = head.new_sequence(8)  # grows as needed
    seq.advance(feats, torch.tensor(nxt))
    assert seq.chain(k).tolist() == ref.chain(nxt, feats, k)


@pytest.mark.parametrize("name", list(CASES))
def test_chain_matches_the_reference(tmp_path, target, name):
    check_chain_matches_reference(tmp_path, target, name)


def check_tree_matches_reference(tmp_path, model, name, top_k=3, depth=3, budget=8) -> None:
    version, w, cfg, path = case_checkpoint(tmp_path, name)
    ref = ReferenceHead(version, w, model, cfg)
    head = head_for(path, model, dtype=torch.float64)
    nxt, feats, _ = rows(model, PROMPT, version)
    seq = head.new_sequence(64)
    seq.advance(feats, torch.tensor(nxt))
    tokens, parents, scores = seq.tree(top_k, depth, budget)
    want_tokens, want_parents, want_scores = ref.tree(nxt, feats, top_k, depth, budget)
    assert (tokens.tolist(), parents.tolist()) == (want_tokens, want_parents)
    torch.testing.assert_close(scores, torch.tensor(want_scores, dtype=scores.dtype),
                               atol=1e-6, rtol=1e-6)
    draft = seq.draft_tree(top_k, depth, budget)
    assert draft.tree_error(budget, top_k) is None and draft.q is None


@pytest.mark.parametrize("name", ["eagle1", "eagle3"])
def test_tree_matches_the_reference(tmp_path, target, name):
    check_tree_matches_reference(tmp_path, target, name)


@pytest.mark.parametrize("backend", [b for b in ("onednn", "fp16") if available(b)])
def test_a_head_packed_for_drafting_drafts_what_the_dense_head_drafts(tmp_path, target, backend):
    """linear: the serving head's products packed once (fused q|k|v and gate|up, RoPE from a
    table) compute the training head's function: the same chains and trees, logits close."""
    version, w, cfg, _ = case_checkpoint(tmp_path, "eagle3")
    w = {k: v.half().float() if v.is_floating_point() else v for k, v in w.items()}
    path = write_checkpoint(tmp_path / "fp16-valued", cfg, w, "safetensors")
    nxt, feats, _ = rows(target, PROMPT, version)
    seqs = []
    for linear in ("dense", backend):
        head = head_for(path, target, dtype=torch.float32, linear=linear)
        assert head.linear == linear
        # a packed head keeps its products once: the loaded weights are let go
        held = sum(t.numel() for t in head.w.tensors().values() if t.dim() == 2)
        assert (held == 0) == (linear != "dense"), (linear, held)
        seq = head.new_sequence(8)
        seq.advance(feats.float(), torch.tensor(nxt))
        seqs.append(seq)
    dense, packed = seqs
    torch.testing.assert_close(packed.root_logits, dense.root_logits, atol=1e-3, rtol=1e-3)
    assert packed.chain(5).tolist() == dense.chain(5).tolist()
    assert [t.tolist() for t in packed.tree(3, 3, 8)[:2]] == \
        [t.tolist() for t in dense.tree(3, 3, 8)[:2]]


def test_the_root_row_scores_as_the_reference(tmp_path, target):
    version, w, cfg, path = case_checkpoint(tmp_path, "eagle3")
    ref = ReferenceHead(version, w, target, cfg)
    head = head_for(path, target, dtype=torch.float64)
    nxt, feats, _ = rows(target, PROMPT, version)
    seq = head.new_sequence(64)
    seq.advance(feats, torch.tensor(nxt))
    want = ref.path_logp(nxt, feats, [])
    torch.testing.assert_close(seq.root_logits.log_softmax(-1), want, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- the head's state


def check_advance_replaces_guesses(tmp_path, model, name="eagle3") -> None:
    """Draft (scratch rows written), then advance with the target's rows of the positions the
    step kept: the state equals one built from the target's rows alone."""
    version, w, cfg, path = case_checkpoint(tmp_path, name)
    head = head_for(path, model, dtype=torch.float64)
    full = PROMPT + [44, 9, 71, 30, 15]
    nxt, feats, _ = rows(model, full, version)
    cut = len(PROMPT)
    stepwise = head.new_sequence(16)
    stepwise.advance(feats[:cut], torch.tensor(nxt[:cut]))
    stepwise.chain(4)
    stepwise.draft_tree(2, 3, 5)
    stepwise.advance(feats[cut:cut + 3], torch.tensor(nxt[cut:cut + 3]))
    stepwise.chain(3)
    stepwise.advance(feats[cut + 3:], torch.tensor(nxt[cut + 3:]))
    fresh = head.new_sequence(64)
    fresh.advance(feats, torch.tensor(nxt))
    assert stepwise.length == fresh.length == len(full)
    torch.testing.assert_close(stepwise.root_logits, fresh.root_logits)
    assert stepwise.chain(4).tolist() == fresh.chain(4).tolist()
    assert stepwise.draft_tree(3, 3, 7).tokens == fresh.draft_tree(3, 3, 7).tokens


def test_advance_replaces_the_heads_own_guesses(tmp_path, target):
    check_advance_replaces_guesses(tmp_path, target)


def check_sequences_together_draft_as_alone(tmp_path, model, name) -> None:
    """Several sequences advanced and drafted together (one pass of the layer per level, each
    attending over its own cache) end in the states and draft the chains each does alone:
    different lengths, different k, a second round over the first's scratch rows."""
    version, w, cfg, path = case_checkpoint(tmp_path, name)
    head = head_for(path, model, dtype=torch.float64)
    fulls = [PROMPT + [44, 9, 71], PROMPT[3:] + [30, 15, 2, 6, 50], PROMPT[:4] + [7]]
    data = [rows(model, f, version)[:2] for f in fulls]
    cuts = [len(PROMPT), 6, 2]
    alone = [head.new_sequence(8) for _ in fulls]  # both grow as needed
    together = [head.new_sequence(8) for _ in fulls]
    for ks, part in (([3, 5, 1], lambda c, n: slice(0, c)), ([2, 1, 4], lambda c, n: slice(c, n))):
        cut = [part(c, len(n)) for c, (n, _) in zip(cuts, data)]
        for s, (nxt, feats), sl in zip(alone, data, cut):
            s.advance(feats[sl], torch.tensor(nxt[sl]))
        advance_many(together, [f[sl] for (_, f), sl in zip(data, cut)],
                     [torch.tensor(n[sl]) for (n, _), sl in zip(data, cut)])
        for a, t in zip(alone, together):
            assert t.length == a.length
            torch.testing.assert_close(t.root_logits, a.root_logits)
        got = chain_many(together, ks)
        assert got.shape == (3, max(ks))
        assert [got[i, :k].tolist() for i, k in enumerate(ks)] == \
            [a.chain(k).tolist() for a, k in zip(alone, ks)]


@pytest.mark.parametrize("name", ["eagle1", "eagle3"])
def test_sequences_drafted_together_draft_as_each_alone(tmp_path, target, name):
    check_sequences_together_draft_as_alone(tmp_path, target, name)


def test_truncate_rolls_back(tmp_path, target):
    version, w, cfg, path = case_checkpoint(tmp_path, "eagle1")
    head = head_for(path, target, dtype=torch.float64)
    nxt, feats, _ = rows(target, PROMPT, version)
    seq = head.new_sequence(64)
    seq.advance(feats, torch.tensor(nxt))
    want = seq.chain(3).tolist()
    seq.advance(feats[:2], torch.tensor([1, 2]))  # rows the sequence then rolls back
    seq.truncate(len(PROMPT) - 1)
    with pytest.raises(RuntimeError, match="advance"):
        seq.chain(1)
    seq.advance(feats[-1:], torch.tensor(nxt[-1:]))
    assert seq.chain(3).tolist() == want


# --------------------------------------------------------------------------- refusals


def test_loaded_spec(tmp_path):
    version, w, cfg, path = case_checkpoint(tmp_path, "eagle3")
    spec, weights = load(path)
    assert (spec.version, spec.draft_vocab_size, spec.feature_size) == (3, 48, 3 * H)
    assert spec.feature_layers(6) == tuple(FEATURE_LAYERS)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.intermediate_size) == (
        HEADS, KV, HEAD_DIM, INTER)
    e1, _ = load(case_checkpoint(tmp_path, "eagle1")[3])
    assert (e1.version, e1.feature_size, e1.feature_layers(30)) == (1, H, ())


def test_default_feature_layers():
    from verifier_service.methods.eagle.checkpoint import EagleSpec

    spec = EagleSpec(3, H, HEADS, KV, HEAD_DIM, INTER, VOCAB, VOCAB, H)
    assert spec.feature_layers(30) == (2, 15, 27)
    with pytest.raises(ValueError, match="eagle_aux_hidden_state_layer_ids"):
        spec.feature_layers(5)


@pytest.mark.parametrize("change,match", [
    (lambda cfg, w: w.pop("midlayer.mlp.down_proj.weight"), "no down"),
    (lambda cfg, w: w.__setitem__("layers.1.mlp.up_proj.weight", torch.zeros(1)), "unexpected"),
    (lambda cfg, w: cfg.__setitem__("num_hidden_layers", 2), "num_hidden_layers"),
    (lambda cfg, w: cfg.__setitem__("hidden_size", "wide"), "hidden_size"),
    (lambda cfg, w: cfg.__setitem__("draft_vocab_size", 50), "lm_head: shape"),
    (lambda cfg, w: w.__setitem__("d2t", w["d2t"] + VOCAB), "d2t maps"),
    (lambda cfg, w: w["d2t"].__setitem__(1, w["d2t"][0] - 1), "two draft ids"),
    (lambda cfg, w: w["t2d"].__setitem__(w["t2d"].logical_not().nonzero()[0], True), "t2d marks"),
    (lambda cfg, w: (cfg.__setitem__("target_hidden_size", 2 * H),  # features 2H wide, the
                     w.__setitem__("fc.weight", torch.zeros(H, 6 * H))),  # target's embedding too
     "cannot use the target's"),
    (lambda cfg, w: w.pop("midlayer.hidden_norm.weight"), "hidden_norm"),
    (lambda cfg, w: w.pop("lm_head.weight"), "needs lm_head"),
    (lambda cfg, w: cfg.__setitem__("eagle_aux_hidden_state_layer_ids", [1, 2]), "three"),
    (lambda cfg, w: cfg.__setitem__("rope_scaling", {"rope_type": "yarn"}), "rope type"),
])
def test_malformed_checkpoints_are_refused_by_name(tmp_path, change, match):
    cfg = config(3, 48)
    w = random_weights(3, seed=8, draft_vocab=48)
    change(cfg, w)
    path = write_checkpoint(tmp_path / "bad", cfg, w)
    with pytest.raises(ValueError, match=match):
        load(path)


def test_misfit_names_what_does_not_fit(tmp_path):
    from verifier_service.methods.eagle.checkpoint import misfit

    spec, _ = load(case_checkpoint(tmp_path, "eagle3")[3])
    target = {"vocab_size": VOCAB, "hidden_size": H, "num_hidden_layers": 6}
    assert misfit(spec, target) is None
    assert "vocabulary" in misfit(spec, target | {"vocab_size": 100})
    assert "width" in misfit(spec, target | {"hidden_size": 32})
    assert "layer" in misfit(spec, target | {"num_hidden_layers": 3})


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
])
def test_scaled_rope_is_transformers_rope(tmp_path, scaling):
    """Published EAGLE-3 heads of Llama 3.1 targets carry llama3 rope scaling: the head rotates
    with transformers' own frequencies for it (and for a linear factor)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from verifier_service.methods.eagle.checkpoint import rope_inv_freq

    cfg = config(3, 48, rope_theta=50000.0, rope_scaling=scaling)
    path = write_checkpoint(tmp_path / "rope", cfg, random_weights(3, seed=2, draft_vocab=48))
    spec, _ = load(path)
    hf = LlamaConfig(hidden_size=H, num_attention_heads=HEADS, head_dim=HEAD_DIM,
                     max_position_embeddings=4096,
                     rope_parameters={"rope_theta": 50000.0, **scaling})
    want, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf, "cpu")
    torch.testing.assert_close(rope_inv_freq(spec), want.float())
    assert dict(spec.rope_scaling)["rope_type"] == scaling["rope_type"]
