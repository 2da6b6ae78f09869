"""An EAGLE head from its config.json alone (`--load-format dummy`): seeded random weights of the
shapes the config gives, for measuring a head of a real target's shape (models/shapes/).

The version follows the config as a published head's would: EAGLE-3 when its architectures
name LlamaForCausalLMEagle3 or its speculators_model_type is eagle3 (then its own lm_head over
draft_vocab_size ids, d2t mapping draft id i to target id i, t2d marking exactly those),
EAGLE-1/2 otherwise. Tensors are drawn from U(-1e-3, 1e-3) in name order from one CPU generator
seeded with `seed` (a head is a few hundred megabytes at most, copied to the target's device when
bound), so a seed gives one head; the spec is read and checked by checkpoint.spec_from exactly as
for a real directory. The drafts are meaningless (the target's are too under dummy weights): only
the head's speed is real.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from verifier_service.methods.eagle import checkpoint as eagle_format

log = logging.getLogger("splitspec.verifier")
LOW, HIGH = -1e-3, 1e-3


def load(path: str | Path, load_format: str = "auto", seed: int = 0, dtype=torch.bfloat16
         ) -> tuple[eagle_format.EagleSpec, eagle_format.EagleWeights]:
    """The head of `path`: its checkpoint (auto), or random weights from its config (dummy)."""
    if load_format != "dummy":
        return eagle_format.load(path)
    path = Path(path)
    try:
        cfg = eagle_format.read_config(path)  # a speculators config read into the same keys
        w = random_tensors(cfg, seed, dtype)
        spec = eagle_format.spec_from(cfg, w)
    except (OSError, json.JSONDecodeError, KeyError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    log.warning("--load-format dummy: the EAGLE head %s has random weights (seed %d); its "
                "drafts are meaningless, only its speed is real", path.name, seed)
    return spec, eagle_format.EagleWeights(**w)


def shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor a head of this config has, by EagleWeights' field names."""
    H = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads", heads))
    D = int(cfg.get("head_dim", H // heads))
    inner = int(cfg["intermediate_size"])
    target_h = int(cfg.get("target_hidden_size", H))
    v3 = eagle_format.EAGLE3_ARCHITECTURE in (cfg.get("architectures") or [])
    att_in = 2 * H if v3 else H
    out = {"q": (heads * D, att_in), "k": (kv * D, att_in), "v": (kv * D, att_in),
           "o": (H, heads * D), "post_norm": (H,), "gate": (inner, H), "up": (inner, H),
           "down": (H, inner)}
    if v3:
        draft_vocab = int(cfg.get("draft_vocab_size", cfg["vocab_size"]))
        out.update({"fc": (H, 3 * target_h), "input_norm": (H,), "hidden_norm": (H,),
                    "norm": (H,), "lm_head": (draft_vocab, H)})
    else:
        out.update({"fc": (H, 2 * H), "fc_bias": (H,)})
    return out


def random_tensors(cfg: dict, seed: int, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in sorted(shapes(cfg).items()):
        w[name] = torch.empty(shape, dtype=dtype).uniform_(LOW, HIGH, generator=gen)
    if "lm_head" in w:
        vocab, draft_vocab = int(cfg["vocab_size"]), w["lm_head"].shape[0]
        w["d2t"] = torch.zeros(draft_vocab, dtype=torch.int64)  # draft id i is target id i
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[:draft_vocab] = True
        w["t2d"] = t2d
    return w
