"""The accelerators' MLP speculator format: a checkpoint written the way IBM's `*-accelerator`
checkpoints are (config.json + model.safetensors or pytorch_model.bin, optional `speculator.`
prefix, tied or not, with or without the input norm) loads in the MLP proposer and drafts what the
format's own forward drafts.

The reference forward below is written from the format's definition, in float64 over the raw
tensors of the file, sharing no code with the proposer:

    s_0 = rms(h) / sqrt(2) if scale_input else h          rms(x) = x / sqrt(mean(x^2) + 1e-6)
    s_i+1 = gelu(rms(a * P_i s_i + b * E_i[tok_i]) * w_i + c_i)      (exact, erf-based GELU)
    logits_i = U_i s_i+1
    a = 0.5 ** (0.5 / n_predict), b = sqrt((1 - a^2) * inner_dim / 2)

Tied: E, U, w, c of head 0 everywhere; P_0 for head 0 and P_1 for every later head.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_proposer_models import TINY_TARGET

from proposer_service.mlp.proposer import MlpSpeculatorProposer
from splitspec.params import SamplingParams
from splitspec.proposal import SequenceStep

CPU = torch.device("cpu")
VOCAB, EMB, INNER, N_PREDICT = 1024, 40, 24, 3  # vocabulary of the tiny target's tokenizer
TEMPERATURE = 0.8


# --------------------------------------------------------------------------- reference


def rms(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def reference_logits(w: dict[str, torch.Tensor], cfg: dict, hidden: torch.Tensor, last: int,
                     path: list[int]) -> list[torch.Tensor]:
    """Each head's logits [V] (float64) along a chain: head 0 sees `last`, head i sees path[i-1].
    w: the file's tensors without prefix; hidden [emb_dim]."""
    n = cfg["n_predict"]
    a = 0.5 ** (0.5 / n)
    b = math.sqrt((1 - a * a) * cfg["inner_dim"] / 2)
    tied = cfg["tie_weights"]
    state = hidden.double()
    if cfg["scale_input"]:
        state = rms(state) / math.sqrt(2)
    out = []
    for i, tok in enumerate([last, *path[: n - 1]]):
        j = 0 if tied else i
        proj = w[f"proj.{min(i, 1) if tied else i}.weight"].double()
        z = w[f"emb.{j}.weight"].double()[tok]
        x = a * (proj @ state) + b * z
        state = gelu(rms(x) * w[f"ln.{j}.weight"].double() + w[f"ln.{j}.bias"].double())
        out.append(w[f"head.{j}.weight"].double() @ state)
    return out


def reference_greedy(w, cfg, hidden, last) -> list[int]:
    path: list[int] = []
    for i in range(cfg["n_predict"]):
        logits = reference_logits(w, cfg, hidden, last, path + [0] * cfg["n_predict"])[i]
        top2 = logits.topk(2).values
        assert top2[0] - top2[1] > 1e-4, "a near tie would make the comparison float noise"
        path.append(int(logits.argmax()))
    return path


# --------------------------------------------------------------------------- checkpoints


def random_checkpoint(tie: bool, scale_input: bool, seed: int) -> tuple[dict, dict]:
    """(config, tensors) in the format; norms get non-trivial scales and shifts."""
    g = torch.Generator().manual_seed(seed)
    n_heads = 1 if tie else N_PREDICT
    w = {}
    for i in range(n_heads):
        w[f"emb.{i}.weight"] = torch.randn(VOCAB, INNER, generator=g) / math.sqrt(INNER)
        w[f"head.{i}.weight"] = torch.randn(VOCAB, INNER, generator=g) * 3 / math.sqrt(INNER)
        w[f"ln.{i}.weight"] = 1 + 0.5 * torch.randn(INNER, generator=g)
        w[f"ln.{i}.bias"] = 0.5 * torch.randn(INNER, generator=g)
    for i in range(2 if tie else N_PREDICT):
        width = EMB if i == 0 else INNER
        w[f"proj.{i}.weight"] = torch.randn(INNER, width, generator=g) / math.sqrt(width)
    cfg = {
        "architectures": ["MLPSpeculatorPreTrainedModel"],
        "model_type": "mlp_speculator",
        "emb_dim": EMB,
        "inner_dim": INNER,
        "vocab_size": VOCAB,
        "n_predict": N_PREDICT,
        "top_k_tokens_per_head": [4, 3, 2],
        "n_candidates": 5,
        "tie_weights": tie,
        "scale_input": scale_input,
        "torch_dtype": "float32",
        "transformers_version": "4.40.0",
    }
    return cfg, w


def write_checkpoint(out: Path, cfg: dict, w: dict, prefix: bool = False,
                     per_head_copies: bool = False, torch_bin: bool = False) -> Path:
    """The files as the format's writers leave them. per_head_copies: a tied model saved with
    every head's (shared) tensors under its own index, as a plain state_dict of tied modules."""
    tensors = dict(w)
    if per_head_copies:
        for i in range(1, cfg["n_predict"]):
            for kind in ("emb", "head"):
                tensors[f"{kind}.{i}.weight"] = w[f"{kind}.0.weight"]
            tensors[f"ln.{i}.weight"], tensors[f"ln.{i}.bias"] = w["ln.0.weight"], w["ln.0.bias"]
            if i >= 2:
                tensors[f"proj.{i}.weight"] = w["proj.1.weight"]
    tensors = {("speculator." if prefix else "") + k: v.clone().contiguous()
               for k, v in tensors.items()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if torch_bin:
        torch.save(tensors, out / "pytorch_model.bin")
    else:
        save_file(tensors, str(out / "model.safetensors"))
    return out


def hidden_states(seed: int, n: int = 6) -> list[torch.Tensor]:
    """[emb_dim] states with a clear mean offset: mean-centring would change them."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(EMB, generator=g) * 2 + 1.5 for _ in range(n)]


def load(path: Path) -> MlpSpeculatorProposer:
    return MlpSpeculatorProposer.load(str(path), CPU, torch.float32, tokenizer=TINY_TARGET,
                                      draft_top_k=VOCAB)


def check_drafts_match_the_reference(path: Path, cfg: dict, w: dict, seed: int) -> None:
    """Greedy: the same tokens. Sampled: the same q at every head along the drafted path."""
    proposer = load(path)
    states = hidden_states(seed)
    lasts = torch.randint(0, VOCAB, (len(states),),
                          generator=torch.Generator().manual_seed(seed)).tolist()
    greedy = [SequenceStep(f"g{i}", [5, last], 2, N_PREDICT, full_history=True, hidden_state=h)
              for i, (h, last) in enumerate(zip(states, lasts))]
    sampled = [SequenceStep(f"s{i}", [5, last], 2, N_PREDICT, full_history=True, hidden_state=h,
                            sampling=SamplingParams(temperature=TEMPERATURE, seed=i))
               for i, (h, last) in enumerate(zip(states, lasts))]
    drafts = proposer.open_session().propose(greedy + sampled)
    for step, d in zip(greedy, drafts[: len(greedy)]):
        want = reference_greedy(w, cfg, step.hidden_state, step.new_tokens[-1])
        assert d.tokens == want, (step.seq_id, d.tokens, want)
    for step, d in zip(sampled, drafts[len(greedy):]):
        assert len(d.tokens) == N_PREDICT and d.q is not None
        logits = reference_logits(w, cfg, step.hidden_state, step.new_tokens[-1], d.tokens)
        q = d.q.to_dense(VOCAB).double()  # [k, V]
        for i, lg in enumerate(logits):
            want = torch.softmax(lg / TEMPERATURE, -1)
            torch.testing.assert_close(q[i], want, atol=2e-5, rtol=0)


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("prefix", [False, True], ids=["plain", "speculator-prefix"])
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("scale_input", [False, True], ids=["raw-input", "scale-input"])
def test_a_format_checkpoint_drafts_what_the_format_defines(tmp_path, prefix, tie, scale_input):
    seed = 4 * tie + 2 * scale_input + prefix
    cfg, w = random_checkpoint(tie, scale_input, seed)
    path = write_checkpoint(tmp_path / "spec", cfg, w, prefix=prefix)
    check_drafts_match_the_reference(path, cfg, w, seed)
    assert load(path).describe().max_num_speculative_tokens == N_PREDICT


def test_tied_per_head_copies_and_pytorch_bin_load_alike(tmp_path):
    cfg, w = random_checkpoint(tie=True, scale_input=True, seed=11)
    path = write_checkpoint(tmp_path / "spec", cfg, w, prefix=True, per_head_copies=True,
                            torch_bin=True)
    check_drafts_match_the_reference(path, cfg, w, seed=11)
    # a "copy" that is not one contradicts tie_weights
    bad = write_checkpoint(tmp_path / "bad", cfg, w, per_head_copies=True)
    tensors = load_file(str(bad / "model.safetensors"))
    tensors["emb.2.weight"] = tensors["emb.2.weight"] + 1
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match="emb.2.weight differs from emb.0.weight"):
        load(bad)


def test_the_projects_own_checkpoints_are_written_in_the_format(tmp_path):
    """save_pretrained writes what the format's loaders expect: the config fields and the weight
    names (no norm weights for ln0), and reading those raw tensors with the reference forward
    gives the module's own drafts."""
    from proposer_service.mlp.speculator import MLPSpeculator, MLPSpeculatorConfig

    torch.manual_seed(0)
    spec = MLPSpeculator(MLPSpeculatorConfig(emb_dim=EMB, inner_dim=INNER, vocab_size=VOCAB,
                                             n_predict=N_PREDICT, tie_weights=True,
                                             scale_input=True))
    with torch.no_grad():  # non-trivial norms, so scale and shift are exercised
        spec.ln[0].weight.normal_(1, 0.5)
        spec.ln[0].bias.normal_(0, 0.5)
        spec.head[0].weight.mul_(3)
    spec.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "mlp_speculator"
    assert cfg["architectures"] == ["MLPSpeculatorPreTrainedModel"]
    for key in ("emb_dim", "inner_dim", "vocab_size", "n_predict", "top_k_tokens_per_head",
                "n_candidates", "tie_weights", "scale_input", "torch_dtype"):
        assert key in cfg, key
    assert len(cfg["top_k_tokens_per_head"]) == cfg["n_predict"]
    w = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(w) == ["emb.0.weight", "head.0.weight", "ln.0.bias", "ln.0.weight",
                         "proj.0.weight", "proj.1.weight"]
    h, last = hidden_states(3, 1)[0], 17
    assert spec.generate_suggestions(h[None], torch.tensor([last]))[0].tolist() == \
        reference_greedy(w, cfg, h, last)


@pytest.mark.parametrize("change, field", [
    ({"n_predict": 0}, "n_predict"),
    ({"emb_dim": "40"}, "emb_dim"),
    ({"inner_dim": -1}, "inner_dim"),
    ({"tie_weights": "yes"}, "tie_weights"),
    ({"scale_input": 1}, "scale_input"),
    ({"top_k_tokens_per_head": [4, 3]}, "top_k_tokens_per_head"),
    ({"top_k_tokens_per_head": [4, 0, 2]}, "top_k_tokens_per_head"),
    ({"n_candidates": 25}, "n_candidates"),
    ({"model_type": "llama"}, "model_type"),
    ({"vocab_size": None}, "vocab_size"),
    ({"torch_dtype": "float99"}, "torch_dtype"),
])
def test_a_malformed_config_is_an_error_naming_the_field(tmp_path, change, field):
    cfg, w = random_checkpoint(tie=False, scale_input=False, seed=0)
    cfg.update(change)
    if change.get("vocab_size", 0) is None:
        del cfg["vocab_size"]
    path = write_checkpoint(tmp_path / "spec", cfg, w)
    with pytest.raises(ValueError, match=field):
        load(path)


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.pop("proj.2.weight"), "lack proj.2.weight"),
    (lambda t: t.update({"ln0.weight": torch.ones(EMB)}), "unexpected tensors ln0.weight"),
    (lambda t: t.update({"head.1.weight": torch.zeros(VOCAB, INNER + 1)}), "head.1.weight has"),
])
def test_missing_unexpected_or_misshapen_tensors_are_named(tmp_path, edit, words):
    cfg, w = random_checkpoint(tie=False, scale_input=False, seed=0)
    edit(w)
    path = write_checkpoint(tmp_path / "spec", cfg, w)
    with pytest.raises(ValueError, match=words):
        load(path)
