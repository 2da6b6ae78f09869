"""EAGLE heads in the speculators format (vllm-project/speculators; what `vllm serve` reads):
their config.json read into the one-layer Llama config the EAGLE reader takes
(verifier_service/methods/eagle/checkpoint.py), and their tensor names into the published ones.
Pure: no files read, no tensors touched.

A speculators head's config.json names its kind in `speculators_model_type` and nests the draft's
decoder layer in `transformer_layer_config` (a transformers config, written as a diff against
its class's defaults: a key left out has LlamaConfig's default, below):

    speculators_model_type  "eagle3" (EAGLE-3) or "eagle" (EAGLE-1/2, HASS)
    speculators_config      algorithm (eagle3; eagle, eagle2 or hass), proposal_methods
                            ([{proposal_type, speculative_tokens, ...}]), default_proposal_method,
                            verifier {name_or_path, architectures, and when written hidden_size,
                            vocab_size}
    transformer_layer_config  model_type llama, hidden_size, num_attention_heads,
                            num_key_value_heads, head_dim, intermediate_size, rms_norm_eps,
                            rope_theta / rope_parameters / rope_scaling, vocab_size (the
                            verifier's), num_hidden_layers 1
    EAGLE-3                 draft_vocab_size (absent: vocab_size), target_hidden_size (absent:
                            hidden_size), norm_before_residual (absent: true, vLLM's reading),
                            eagle_aux_hidden_state_layer_ids; norm_before_fc, fc_norm and
                            norm_output must be false (heads with those extra norms are refused)
    EAGLE-1/2               transformer_layer_architecture LlamaDecoderLayer, fusion_bias (the
                            fc's bias), layernorms false (HASS's extra norms are refused)

Tensors: EAGLE-3 `layers.0.*`, `fc.weight`, `norm.weight`, `lm_head.weight`, `embed_tokens.weight`,
`d2t`, `t2d` (the published names but for the layer's prefix; the training-only copies
`verifier_lm_head.weight` and `verifier_norm.weight` are skipped); EAGLE-1/2 `fusion_fc.weight`
and `fusion_fc.bias` (the fc), `transformer.*` (the decoder layer), `embed_tokens.weight`.
Anything the reader cannot serve raises ValueError naming the key.
"""

from __future__ import annotations

MODEL_TYPE_KEY = "speculators_model_type"
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"  # the published EAGLE-3 heads' architecture

# transformers' LlamaConfig() for the keys the reader takes (a transformer_layer_config is
# written as a diff against these; num_key_value_heads and head_dim default from the others)
LLAMA_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_act": "silu",
                  "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                  "attention_bias": False, "mlp_bias": False}
ALGORITHMS = {"eagle3": ("eagle3",), "eagle": ("eagle", "eagle2", "hass")}
# EAGLE-3 variants with norms the head does not have: served only when false
UNSERVED_EAGLE3_FLAGS = {
    "norm_before_fc": "an RMSNorm over the three features before fc",
    "fc_norm": "an RMSNorm on each feature before fc",
    "norm_output": "the final norm's output fed back to the next drafting step"}


def is_speculators(cfg: dict) -> bool:
    """Whether a config.json is in the speculators format."""
    return MODEL_TYPE_KEY in cfg


def _object(value, key: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"config.json: {key} must be an object, not {value!r}")
    return value


def _size(value, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"config.json: {key} must be a positive integer, not {value!r}")
    return value


def verifier_of(cfg: dict) -> dict:
    """speculators_config.verifier: the verifier the head was made for ({} when not given)."""
    spec = cfg.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    return verifier if isinstance(verifier, dict) else {}


def speculative_tokens(cfg: dict) -> int | None:
    """The tokens the head's default proposal method drafts (vLLM's default
    num_speculative_tokens for it), or None when the config names none."""
    spec = cfg.get("speculators_config")
    methods = spec.get("proposal_methods") if isinstance(spec, dict) else None
    if not isinstance(methods, list) or not methods:
        return None
    default = spec.get("default_proposal_method")
    chosen = [m for m in methods if isinstance(m, dict) and m.get("proposal_type") == default]
    first = chosen[0] if chosen else methods[0]
    k = first.get("speculative_tokens") if isinstance(first, dict) else None
    return k if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else None


def flat_config(cfg: dict) -> dict:
    """The one-layer Llama config.json of the published EAGLE formats that says what this
    speculators config says (ValueError naming the key the reader cannot serve). It keeps
    speculators_model_type (the tensors' names follow it: published_name), and the verifier's
    name and sizes, when given, as verifier_name_or_path / verifier_hidden_size /
    verifier_vocab_size."""
    kind = cfg.get(MODEL_TYPE_KEY)
    if kind not in ALGORITHMS:
        raise ValueError(f"config.json: {MODEL_TYPE_KEY} {kind!r} is not an EAGLE head "
                         f"(served: {', '.join(sorted(ALGORITHMS))})")
    spec = _object(cfg.get("speculators_config"), "speculators_config")
    algorithm = spec.get("algorithm")
    if algorithm not in ALGORITHMS[kind]:
        raise ValueError(f"config.json: speculators_config.algorithm {algorithm!r} is not one "
                         f"a {kind} head implements ({', '.join(ALGORITHMS[kind])})")
    layer = _object(cfg.get("transformer_layer_config"), "transformer_layer_config")
    model_type = layer.get("model_type", "llama")
    if model_type != "llama":
        raise ValueError(f"config.json: transformer_layer_config.model_type {model_type!r}: "
                         "only Llama decoder layers are served (another family's layer, such "
                         "as qwen3's with its q/k norms, computes something else)")
    flat = LLAMA_DEFAULTS | {k: v for k, v in layer.items() if v is not None} | {
        MODEL_TYPE_KEY: kind}
    if flat["num_hidden_layers"] != 1:
        raise ValueError(f"config.json: transformer_layer_config.num_hidden_layers "
                         f"{flat['num_hidden_layers']!r}: an EAGLE head served here has one "
                         "decoder layer")
    if flat["mlp_bias"]:
        raise ValueError("config.json: transformer_layer_config.mlp_bias true is not served "
                         "(the head's MLP has no biases)")
    if kind == "eagle3":
        for key, what in UNSERVED_EAGLE3_FLAGS.items():
            if cfg.get(key, False):
                raise ValueError(f"config.json: {key} true ({what}) is not served")
        flat |= {"architectures": [EAGLE3_ARCHITECTURE],
                 "draft_vocab_size": cfg.get("draft_vocab_size") or flat["vocab_size"],
                 "norm_before_residual": bool(cfg.get("norm_before_residual", True))}
        if cfg.get("target_hidden_size") is not None:
            flat["target_hidden_size"] = cfg["target_hidden_size"]
        if cfg.get("eagle_aux_hidden_state_layer_ids"):
            flat["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]
    else:
        arch = cfg.get("transformer_layer_architecture", "LlamaDecoderLayer")
        if arch != "LlamaDecoderLayer":
            raise ValueError(f"config.json: transformer_layer_architecture {arch!r}: only "
                             "LlamaDecoderLayer is served")
        if cfg.get("layernorms", False):
            raise ValueError("config.json: layernorms true (extra norms on the embedding, the "
                             "layer's input and before the output head) is not served")
        flat["architectures"] = ["LlamaForCausalLM"]
        flat["fusion_bias"] = bool(cfg.get("fusion_bias", False))
    verifier = _object(spec.get("verifier") or {}, "speculators_config.verifier")
    width = flat.get("target_hidden_size") or flat["hidden_size"]
    for key, own, what in (("hidden_size", width, "the features the head reads are"),
                           ("vocab_size", flat["vocab_size"],
                            "transformer_layer_config.vocab_size is")):
        if verifier.get(key) is not None:
            value = _size(verifier[key], f"speculators_config.verifier.{key}")
            if value != own:
                raise ValueError(f"config.json: speculators_config.verifier.{key} is {value} "
                                 f"but {what} {own}")
            flat[f"verifier_{key}"] = value
    if verifier.get("name_or_path"):
        flat["verifier_name_or_path"] = str(verifier["name_or_path"])
    return flat


# the speculators name of a tensor -> its published name (EAGLE-1/2's fc and decoder layer)
_EAGLE1_PREFIXES = (("fusion_fc.", "fc."), ("transformer.", "layers.0."))
_SKIPPED = ("verifier_lm_head.weight", "verifier_norm.weight")  # training-only verifier copies


def published_name(name: str, kind: str) -> str | None:
    """The published EAGLE name of a speculators tensor (None: a tensor the head does not use)."""
    key = name.removeprefix("model.")
    if key in _SKIPPED:
        return None
    if kind == "eagle":
        for old, new in _EAGLE1_PREFIXES:
            if key.startswith(old):
                return new + key[len(old):]
    return key
