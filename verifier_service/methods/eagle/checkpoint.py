"""EAGLE heads' file formats, as the ecosystem publishes them: EAGLE-1/2 and EAGLE-3.

A head directory holds a Llama-style `config.json` describing one decoder layer and the weights
(`model.safetensors`, sharded safetensors, or `pytorch_model.bin`). Tensor names, with any
`model.` prefix dropped:

  EAGLE-1/2  fc.weight [H, 2H] (fc.bias [H] when the checkpoint has one: the EAGLE repository's
             heads do; it is used), layers.0.self_attn.{q,k,v,o}_proj.weight,
             layers.0.post_attention_layernorm.weight, layers.0.mlp.{gate,up,down}_proj.weight;
             optional embed_tokens.weight (used when present, else the target's embedding).
             layers.0.input_layernorm.weight may be present and is not used (layer 0 of an
             EAGLE-1 head has no input norm). No final norm; the target's output head.
  EAGLE-3    midlayer.* (or layers.0.*) with q/k/v_proj over 2H inputs, midlayer.input_layernorm
             (on the token embedding), midlayer.hidden_norm (on the hidden state),
             post_attention_layernorm and mlp; fc.weight [H, 3 * target_hidden_size]; norm.weight;
             lm_head.weight [draft_vocab_size, H] (absent: the target's output head, which needs
             draft_vocab_size = vocab_size); d2t [draft_vocab_size] (target id = draft id +
             d2t[draft id]); t2d [vocab_size] bool (which target ids the head can say: refused
             unless it marks exactly the ids d2t maps to). Optional embed_tokens.weight.

Config fields read: hidden_size, num_attention_heads, num_key_value_heads, head_dim,
intermediate_size, rms_norm_eps, rope_theta / rope_parameters / rope_scaling (default, linear or
llama3 rope: `rope_inv_freq`),
vocab_size, draft_vocab_size, target_hidden_size, norm_before_residual, attention_bias,
eagle_config.use_aux_hidden_state, and the feature layers eagle_aux_hidden_state_layer_ids (top
level, as vLLM reads it, or inside eagle_config, as SGLang does). The ids name the layers whose
*inputs* (the residual stream entering them) are the features, vLLM's reading; SGLang reads an
explicit id as the layer whose output is taken, one layer later; both default to the inputs of
layers 2, L // 2 and L - 3 of an L-layer target. Which version a directory holds is read from
its weights (q_proj over 2H inputs: EAGLE-3). Anything malformed raises ValueError naming the
field or tensor.

A head in the speculators format (config.json with speculators_model_type: what `vllm serve`
reads) is read through splitspec/speculators_format.py: its config into the keys above, its
tensor names into the published ones, so both formats load into the same EagleSpec and
EagleWeights; its speculators_config.verifier (name, and sizes when given) is kept in the spec
and named when the head does not fit a target.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from splitspec import speculators_format
from splitspec.modelio import read_weight_files

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
MAX_FILE_BYTES = 64 * 1024 * 1024  # the project's cap on a shipped head's weight file


@dataclass(frozen=True)
class EagleSpec:
    """What a head is: its version and shapes (from config.json and the weights)."""

    version: int  # 1 (EAGLE-1/2) or 3
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int  # rows of the head's own lm_head (EAGLE-3); vocab_size for EAGLE-1
    target_hidden_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # (name, value) pairs of the config's rope scaling: rope_type "linear" (factor) or "llama3"
    # (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings); (): none
    rope_scaling: tuple[tuple[str, object], ...] = ()
    norm_before_residual: bool = False
    use_aux_hidden_state: bool = True
    aux_layer_ids: tuple[int, ...] | None = None  # None: the default 2, L // 2, L - 3
    max_position_embeddings: int = 8192
    # speculators format: (key, value) pairs of speculators_config.verifier the head was made
    # for (name_or_path, and hidden_size / vocab_size when the config gives them); () otherwise
    verifier: tuple[tuple[str, object], ...] = ()

    @property
    def feature_size(self) -> int:
        """Width of the target features a row takes: 3 x the target's hidden size for EAGLE-3
        (three layers' inputs), the target's hidden size otherwise."""
        if self.version == 3 and self.use_aux_hidden_state:
            return 3 * self.target_hidden_size
        return self.target_hidden_size

    def feature_layers(self, target_layers: int) -> tuple[int, ...]:
        """EAGLE-3: the target layers whose inputs are the features (ValueError when the target
        cannot give three distinct ones). EAGLE-1/2: () (the final-norm hidden state)."""
        if self.version != 3 or not self.use_aux_hidden_state:
            return ()
        ids = self.aux_layer_ids
        if ids is None:
            ids = (2, target_layers // 2, target_layers - 3)
            if len(set(ids)) < 3 or min(ids) < 0:
                raise ValueError(f"a {target_layers}-layer target has no three distinct default "
                                 "feature layers: the head's config must name "
                                 "eagle_aux_hidden_state_layer_ids")
        if any(not 0 <= i < target_layers for i in ids):
            raise ValueError(f"eagle_aux_hidden_state_layer_ids {list(ids)} are not layers of a "
                             f"{target_layers}-layer target")
        return tuple(ids)


@dataclass
class EagleWeights:
    """The head's tensors under one set of names, whichever version (None: absent)."""

    q: torch.Tensor  # [heads * head_dim, H or 2H]
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor  # [H, heads * head_dim]
    post_norm: torch.Tensor  # [H]
    gate: torch.Tensor  # [I, H]
    up: torch.Tensor
    down: torch.Tensor  # [H, I]
    fc: torch.Tensor | None = None  # [H, 2H] (EAGLE-1) / [H, 3 Ht] (EAGLE-3)
    fc_bias: torch.Tensor | None = None
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    embed: torch.Tensor | None = None  # [V, H]: the head's own token embedding
    input_norm: torch.Tensor | None = None  # EAGLE-3: on the embedding
    hidden_norm: torch.Tensor | None = None  # EAGLE-3: on the hidden state
    norm: torch.Tensor | None = None  # EAGLE-3 final norm
    lm_head: torch.Tensor | None = None  # EAGLE-3 [draft_vocab_size, H]
    d2t: torch.Tensor | None = None  # EAGLE-3 [draft_vocab_size] int64 offsets
    t2d: torch.Tensor | None = None  # EAGLE-3 [vocab_size] bool

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}

    def draft_to_target(self) -> torch.Tensor | None:
        """Target token id of each draft id [draft_vocab_size] (None: the identity)."""
        if self.d2t is None:
            return None
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t.long()


_LAYER = {"self_attn.q_proj.weight": "q", "self_attn.k_proj.weight": "k",
          "self_attn.v_proj.weight": "v", "self_attn.o_proj.weight": "o",
          "self_attn.q_proj.bias": "q_bias", "self_attn.k_proj.bias": "k_bias",
          "self_attn.v_proj.bias": "v_bias", "self_attn.o_proj.bias": "o_bias",
          "post_attention_layernorm.weight": "post_norm", "mlp.gate_proj.weight": "gate",
          "mlp.up_proj.weight": "up", "mlp.down_proj.weight": "down",
          "input_layernorm.weight": "input_norm", "hidden_norm.weight": "hidden_norm"}
_TOP = {"fc.weight": "fc", "fc.bias": "fc_bias", "embed_tokens.weight": "embed",
        "norm.weight": "norm", "lm_head.weight": "lm_head", "d2t": "d2t", "t2d": "t2d"}


def canonical_names(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under EagleWeights' field names; ValueError on a tensor this
    format does not have (a second layer, a misspelt name)."""
    out = {}
    for name, t in raw.items():
        key = name.removeprefix("model.")
        for layer in ("midlayer.", "layers.0."):
            if key.startswith(layer) and key[len(layer):] in _LAYER:
                out[_LAYER[key[len(layer):]]] = t
                break
        else:
            if key in _TOP:
                out[_TOP[key]] = t
            elif key.endswith("rotary_emb.inv_freq"):
                continue  # a buffer some exports save; recomputed from rope_theta
            else:
                raise ValueError(f"unexpected tensor {name!r} (an EAGLE head has one decoder "
                                 "layer: midlayer.* or layers.0.*, fc, norm, lm_head, d2t, t2d, "
                                 "embed_tokens)")
    return out


def _need_int(cfg: dict, name: str, default=None) -> int:
    value = cfg.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config.json: {name} must be a positive integer, not {value!r}")
    return value


_ROPE_KEYS = {"linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings")}


def _rope(cfg: dict) -> tuple[float, tuple]:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return theta, ()
    if kind not in _ROPE_KEYS:
        raise ValueError(f"config.json: rope type {kind!r} is not supported (default, linear, "
                         "llama3)")
    missing = [k for k in _ROPE_KEYS[kind] if k not in rope]
    if missing:
        raise ValueError(f"config.json: {kind} rope scaling needs {missing[0]}")
    return theta, (("rope_type", kind), *((k, float(rope[k])) for k in _ROPE_KEYS[kind]))


def rope_inv_freq(spec: EagleSpec) -> torch.Tensor:
    """RoPE's inverse frequencies [head_dim / 2] for the spec's theta and scaling: linear divides
    them by the factor (positions / factor); llama3 divides the low frequencies (wavelength above
    original_max / low_freq_factor) by the factor, keeps the high ones (wavelength below
    original_max / high_freq_factor) and blends linearly in the wavelength's inverse between."""
    half = torch.arange(0, spec.head_dim, 2, dtype=torch.float32)
    inv = 1.0 / (spec.rope_theta ** (half / spec.head_dim))
    scaling = dict(spec.rope_scaling)
    kind = scaling.get("rope_type")
    if kind == "linear":
        return inv / scaling["factor"]
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], \
            scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        blend = ((old / wavelen - low) / (high - low)).clamp(0.0, 1.0)  # 0: low, 1: high freq
        return (1 - blend) * inv / factor + blend * inv
    return inv


def spec_from(cfg: dict, w: dict[str, torch.Tensor]) -> EagleSpec:
    """The head's spec from its config.json and (canonically named) weights."""
    for name in ("q", "k", "v", "o", "post_norm", "gate", "up", "down"):
        if name not in w:
            raise ValueError(f"the checkpoint has no {name} tensor (the decoder layer's "
                             "projections and norms are required)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.json: hidden_act {cfg.get('hidden_act')!r} is not silu")
    if int(cfg.get("num_hidden_layers", 1)) != 1:
        raise ValueError("config.json: num_hidden_layers must be 1 (an EAGLE head has one "
                         "decoder layer)")
    H = _need_int(cfg, "hidden_size")
    heads = _need_int(cfg, "num_attention_heads")
    kv = _need_int(cfg, "num_key_value_heads", heads)
    head_dim = _need_int(cfg, "head_dim", H // heads)
    version = 3 if w["q"].shape[1] == 2 * H else 1
    eagle = cfg.get("eagle_config") or {}
    ids = cfg.get("eagle_aux_hidden_state_layer_ids", eagle.get("eagle_aux_hidden_state_layer_ids"))
    if ids is not None and (not isinstance(ids, list) or len(ids) != 3
                            or not all(isinstance(i, int) for i in ids)):
        raise ValueError(f"config.json: eagle_aux_hidden_state_layer_ids must list three layer "
                         f"ids, not {ids!r}")
    vocab = _need_int(cfg, "vocab_size")
    theta, scaling = _rope(cfg)
    spec = EagleSpec(
        version=version, hidden_size=H, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        intermediate_size=_need_int(cfg, "intermediate_size"), vocab_size=vocab,
        draft_vocab_size=(_need_int(cfg, "draft_vocab_size", vocab) if version == 3 else vocab),
        target_hidden_size=_need_int(cfg, "target_hidden_size", H),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)), rope_theta=theta, rope_scaling=scaling,
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        use_aux_hidden_state=bool(eagle.get("use_aux_hidden_state", True)),
        aux_layer_ids=tuple(ids) if ids is not None else None,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 8192)),
        verifier=tuple((key, cfg[f"verifier_{key}"])
                       for key in ("name_or_path", "hidden_size", "vocab_size")
                       if cfg.get(f"verifier_{key}") is not None))
    if "fc" not in w and (version == 1 or spec.use_aux_hidden_state):
        raise ValueError("the checkpoint has no fc.weight (it fuses the target's features)")
    check_shapes(spec, w)
    return spec


def check_shapes(spec: EagleSpec, w: dict[str, torch.Tensor]) -> None:
    """ValueError naming the first tensor whose shape the spec does not give."""
    H, D, inner = spec.hidden_size, spec.head_dim, spec.intermediate_size
    att_in = 2 * H if spec.version == 3 else H
    want = {"q": (spec.num_heads * D, att_in), "k": (spec.num_kv_heads * D, att_in),
            "v": (spec.num_kv_heads * D, att_in), "o": (H, spec.num_heads * D),
            "post_norm": (H,), "gate": (inner, H), "up": (inner, H), "down": (H, inner),
            "fc_bias": (H,), "q_bias": (spec.num_heads * D,), "k_bias": (spec.num_kv_heads * D,),
            "v_bias": (spec.num_kv_heads * D,), "o_bias": (H,),
            "embed": (spec.vocab_size, H)}
    if spec.version == 3:
        want.update({"input_norm": (H,), "hidden_norm": (H,), "norm": (H,),
                     "lm_head": (spec.draft_vocab_size, H), "d2t": (spec.draft_vocab_size,),
                     "t2d": (spec.vocab_size,)})
        fc_in = spec.feature_size if spec.use_aux_hidden_state else None
        for name in ("input_norm", "hidden_norm", "norm"):
            if name not in w:
                raise ValueError(f"an EAGLE-3 checkpoint needs {name} (midlayer.input_layernorm, "
                                 "midlayer.hidden_norm, norm)")
        if "lm_head" not in w and spec.draft_vocab_size != spec.vocab_size:
            raise ValueError("an EAGLE-3 checkpoint with a draft vocabulary needs lm_head "
                             "(without one it scores with the target's output head)")
        if spec.draft_vocab_size != spec.vocab_size and "d2t" not in w:
            raise ValueError("d2t is required when draft_vocab_size differs from vocab_size")
    else:
        fc_in = 2 * H
    if fc_in is not None:
        want["fc"] = (H, fc_in)
    for name, shape in want.items():
        if name in w and tuple(w[name].shape) != shape:
            raise ValueError(f"{name}: shape {list(w[name].shape)}, the config gives "
                             f"{list(shape)}")
    if spec.hidden_size != spec.target_hidden_size:
        borrowed = [name for name, own in (("embed_tokens", "embed" in w),
                                           ("lm_head", spec.version == 3 and "lm_head" in w))
                    if not own]
        if borrowed:
            raise ValueError(f"the head's hidden size is {H} and its target's "
                             f"{spec.target_hidden_size}: it cannot use the target's "
                             f"{' or '.join(borrowed)}, and the checkpoint has none of its own")
    ids = torch.arange(spec.draft_vocab_size)  # the target id of each draft id
    if "d2t" in w:
        ids = ids + w["d2t"].long()
        if bool((ids < 0).any()) or bool((ids >= spec.vocab_size).any()):
            raise ValueError(f"d2t maps a draft id outside the target vocabulary of "
                             f"{spec.vocab_size}")
        if ids.unique().numel() != ids.numel():
            raise ValueError("d2t maps two draft ids to one target id")
    if "t2d" in w:  # the mask of the target ids the head can say: exactly d2t's image
        said = torch.zeros(spec.vocab_size, dtype=torch.bool)
        said[ids] = True
        if not torch.equal(w["t2d"].bool(), said):
            raise ValueError(f"t2d marks {int(w['t2d'].bool().sum())} target ids and d2t "
                             f"maps to {spec.draft_vocab_size}: they disagree on "
                             f"{int((w['t2d'].bool() != said).sum())}")


def read_config(path: Path) -> dict:
    """A head directory's config.json as the reader takes it: a speculators-format config read
    into the published keys (ValueError naming the key it cannot serve)."""
    cfg = json.loads((path / CONFIG_NAME).read_text())
    if not isinstance(cfg, dict):
        raise ValueError("config.json is not a JSON object")
    return speculators_format.flat_config(cfg) if speculators_format.is_speculators(cfg) \
        else cfg


def from_speculators(cfg: dict, kind: str, raw: dict[str, torch.Tensor]
                     ) -> dict[str, torch.Tensor]:
    """A speculators head's tensors under the published names (ValueError on an fc bias that
    fusion_bias contradicts, or on a table the speculators library never filled: it creates the
    embedding and output head as NaN until they are loaded)."""
    w = {}
    for name, t in raw.items():
        new = speculators_format.published_name(name, kind)
        if new is not None:
            w[new] = t
    if kind == "eagle" and cfg["fusion_bias"] != ("fc.bias" in w):
        raise ValueError("fusion_bias is true but the checkpoint has no fusion_fc.bias"
                         if cfg["fusion_bias"] else
                         "the checkpoint has fusion_fc.bias but config.json says fusion_bias "
                         "false")
    for name in ("embed_tokens.weight", "lm_head.weight"):
        if name in w and bool(torch.isnan(w[name]).any()):
            raise ValueError(f"{name} holds NaN (saved before the table was loaded)")
    return w


def load(path: str | Path) -> tuple[EagleSpec, EagleWeights]:
    """Read a head directory, in a published format or the speculators one (ValueError naming
    the file and what is wrong)."""
    path = Path(path)
    try:
        cfg = read_config(path)
        raw = read_weight_files(path, WEIGHTS_NAME)
        kind = cfg.get(speculators_format.MODEL_TYPE_KEY)
        if kind is not None:
            raw = from_speculators(cfg, kind, raw)
        w = canonical_names(raw)
        spec = spec_from(cfg, w)
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if spec.version == 1:
        w.pop("input_norm", None)  # layer 0 of an EAGLE-1 head has no input norm
    return spec, EagleWeights(**w)


def eagle3_config(spec: EagleSpec, **extra) -> dict:
    """config.json of an EAGLE-3 head as the published ones are written (a one-layer Llama
    config with draft_vocab_size and the feature layers)."""
    cfg = {
        "architectures": [EAGLE3_ARCHITECTURE], "model_type": "llama",
        "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim, "num_hidden_layers": 1, "hidden_act": "silu",
        "rms_norm_eps": spec.rms_norm_eps, "rope_theta": spec.rope_theta,
        "max_position_embeddings": spec.max_position_embeddings,
        "vocab_size": spec.vocab_size, "draft_vocab_size": spec.draft_vocab_size,
        "target_hidden_size": spec.target_hidden_size, "tie_word_embeddings": False,
        "norm_before_residual": spec.norm_before_residual, "torch_dtype": "float16",
        "eagle_config": {"use_aux_hidden_state": spec.use_aux_hidden_state},
    }
    if spec.rope_scaling:
        cfg["rope_scaling"] = dict(spec.rope_scaling)
    if spec.aux_layer_ids is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = list(spec.aux_layer_ids)
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(spec.aux_layer_ids)
    return cfg | extra


_STORED = {"q": "midlayer.self_attn.q_proj.weight", "k": "midlayer.self_attn.k_proj.weight",
           "v": "midlayer.self_attn.v_proj.weight", "o": "midlayer.self_attn.o_proj.weight",
           "post_norm": "midlayer.post_attention_layernorm.weight",
           "gate": "midlayer.mlp.gate_proj.weight", "up": "midlayer.mlp.up_proj.weight",
           "down": "midlayer.mlp.down_proj.weight",
           "input_norm": "midlayer.input_layernorm.weight",
           "hidden_norm": "midlayer.hidden_norm.weight", "fc": "fc.weight", "norm": "norm.weight",
           "lm_head": "lm_head.weight", "d2t": "d2t", "t2d": "t2d"}


def save_eagle3(path: str | Path, spec: EagleSpec, w: EagleWeights, **config_extra) -> None:
    """Write an EAGLE-3 head (fp16 weights; d2t int64, t2d bool) under the published names.
    ValueError if the weight file would exceed MAX_FILE_BYTES."""
    from safetensors.torch import save_file

    if spec.version != 3:
        raise ValueError("only EAGLE-3 heads are written")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, t in w.tensors().items():
        if name not in _STORED:
            raise ValueError(f"{name} is not part of an EAGLE-3 checkpoint")
        t = t.detach().cpu().contiguous()
        out[_STORED[name]] = t.long() if name == "d2t" else (
            t.bool() if name == "t2d" else t.to(torch.float16))
    size = sum(t.numel() * t.element_size() for t in out.values())
    if size > MAX_FILE_BYTES:
        raise ValueError(f"the head's weights are {size / 2**20:.1f} MiB, over the "
                         f"{MAX_FILE_BYTES // 2**20} MiB cap")
    save_file(out, str(path / WEIGHTS_NAME), metadata={"format": "pt"})
    (path / CONFIG_NAME).write_text(json.dumps(eagle3_config(spec, **config_extra), indent=2)
                                    + "\n")


def misfit(spec: EagleSpec, target_config: dict) -> str | None:
    """Why a head cannot run on a target with this config.json (None: it can): the vocabulary,
    the hidden size its features have, and (EAGLE-3) three feature layers the target has. A
    speculators head's reason names the speculators_config.verifier key that disagrees and the
    verifier it was made for."""
    vocab, hidden = target_config.get("vocab_size"), target_config.get("hidden_size")
    made = dict(spec.verifier)
    made_for = (f" (it was made for {made['name_or_path']})" if made.get("name_or_path")
                else "")
    if spec.vocab_size != vocab:
        if "vocab_size" in made:
            return f"the head's speculators_config.verifier.vocab_size is {spec.vocab_size}, " \
                   f"the target's vocabulary {vocab} tokens{made_for}"
        return f"the head's vocabulary is {spec.vocab_size} tokens, the target's {vocab}" \
               f"{made_for}"
    if spec.target_hidden_size != hidden:
        if "hidden_size" in made:
            return f"the head's speculators_config.verifier.hidden_size is " \
                   f"{spec.target_hidden_size}, the target's hidden size {hidden}{made_for}"
        return f"the head reads features of width {spec.target_hidden_size}, the target's " \
               f"hidden size is {hidden}{made_for}"
    try:
        spec.feature_layers(int(target_config.get("num_hidden_layers", 0)))
    except ValueError as exc:
        return str(exc)
    return None


def target_tables(spec: EagleSpec, weights: EagleWeights) -> tuple[str, ...]:
    """Which of the target's vocabulary tables the head reads: "embed" (the token embedding,
    unless the checkpoint has its own) and "head" (the output head it scores with: EAGLE-1/2,
    or an EAGLE-3 head without its own lm_head)."""
    return ((() if weights.embed is not None else ("embed",))
            + (() if spec.version == 3 and weights.lm_head is not None else ("head",)))
