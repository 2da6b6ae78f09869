"""The MLP speculator's file format: the accelerators' config.json and weight files.

A checkpoint directory holds ``config.json`` (Hugging Face style: ``model_type: mlp_speculator``,
``architectures: [MLPSpeculatorPreTrainedModel]``, ``emb_dim``, ``inner_dim``, ``vocab_size``,
``n_predict``, ``top_k_tokens_per_head``, ``n_candidates``, ``tie_weights``, ``scale_input``,
``torch_dtype``) and the weights as ``model.safetensors`` (or sharded with
``model.safetensors.index.json``, or ``pytorch_model.bin``). Tensor names are ``emb.i.weight``,
``proj.i.weight``, ``head.i.weight``, ``ln.i.weight`` and ``ln.i.bias``, optionally prefixed with
``speculator.`` (as the Hugging Face wrapper saves them). The project's own checkpoints add two
informational fields, ``target_model`` and ``target_vocab_fingerprint``.

Fields a file leaves out take the format's defaults (inner_dim 0 = emb_dim, tie_weights and
scale_input false); emb_dim, vocab_size and n_predict are required. A malformed field raises
ValueError naming it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from splitspec.modelio import read_weight_files

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
MODEL_TYPE = "mlp_speculator"
ARCHITECTURE = "MLPSpeculatorPreTrainedModel"
PREFIX = "speculator."


@dataclass
class MLPSpeculatorConfig:
    emb_dim: int  # the target's hidden size (size of the state handed over by the verifier)
    vocab_size: int  # must equal the target's vocabulary size
    inner_dim: int = 0  # width of the running state; 0 means emb_dim
    n_predict: int = 4  # number of trained heads (tokens drafted per step)
    tie_weights: bool = True  # share emb/ln/head across heads, proj across heads >= 1
    scale_input: bool = True  # scale-free RMS norm (ln0) and 1/sqrt(2) on the incoming state
    # candidate tree: head i expands each path by its top top_k_tokens_per_head[i] tokens and the
    # n_candidates most likely paths are kept; a chain is the tree of width 1 (empty = [1] * n)
    top_k_tokens_per_head: list[int] = field(default_factory=list)
    n_candidates: int = 1
    target_model: str = ""  # which target it was trained on (a path or name, informational)
    target_vocab_fingerprint: str = ""  # sha256 of the target tokenizer's vocabulary
    dtype: str = "float16"  # dtype of the stored weights (torch_dtype in the file)

    def __post_init__(self) -> None:
        if self.inner_dim == 0:
            self.inner_dim = self.emb_dim
        if not self.top_k_tokens_per_head:
            self.top_k_tokens_per_head = [1] * self.n_predict
        self.validate()

    def validate(self) -> None:
        for name in ("emb_dim", "vocab_size", "inner_dim", "n_predict", "n_candidates"):
            _check_int(name, getattr(self, name), minimum=1)
        for name in ("tie_weights", "scale_input"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, not {getattr(self, name)!r}")
        if self.tie_weights and self.n_predict < 2:
            raise ValueError("tie_weights needs n_predict >= 2 (there is nothing to share)")
        widths = self.top_k_tokens_per_head
        if not isinstance(widths, list) or len(widths) != self.n_predict:
            raise ValueError(f"top_k_tokens_per_head must list one width per head "
                             f"(n_predict={self.n_predict}), not {widths!r}")
        for w in widths:
            _check_int("top_k_tokens_per_head", w, minimum=1)
        if self.n_candidates > math.prod(widths):
            raise ValueError(f"n_candidates={self.n_candidates} exceeds the "
                             f"{math.prod(widths)} paths top_k_tokens_per_head={widths} gives")
        if not hasattr(torch, str(self.dtype)) or not isinstance(
                getattr(torch, str(self.dtype)), torch.dtype):
            raise ValueError(f"torch_dtype {self.dtype!r} is not a torch dtype")

    def to_dict(self) -> dict:
        return {
            "model_type": MODEL_TYPE,
            "architectures": [ARCHITECTURE],
            "emb_dim": self.emb_dim,
            "inner_dim": self.inner_dim,
            "vocab_size": self.vocab_size,
            "n_predict": self.n_predict,
            "top_k_tokens_per_head": list(self.top_k_tokens_per_head),
            "n_candidates": self.n_candidates,
            "tie_weights": self.tie_weights,
            "scale_input": self.scale_input,
            "torch_dtype": self.dtype,
            "target_model": self.target_model,
            "target_vocab_fingerprint": self.target_vocab_fingerprint,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "MLPSpeculatorConfig":
        """A config.json's fields (other keys, e.g. transformers_version, are ignored)."""
        if d.get("model_type", MODEL_TYPE) != MODEL_TYPE:
            raise ValueError(f"model_type must be {MODEL_TYPE!r}, not {d.get('model_type')!r}")
        for name in ("emb_dim", "vocab_size", "n_predict"):
            if name not in d:
                raise ValueError(f"config has no {name}")
        return cls(
            emb_dim=d["emb_dim"],
            vocab_size=d["vocab_size"],
            inner_dim=_int_or(d, "inner_dim", 0),
            n_predict=d["n_predict"],
            tie_weights=d.get("tie_weights", False),
            scale_input=d.get("scale_input", False),
            top_k_tokens_per_head=d.get("top_k_tokens_per_head") or [],
            n_candidates=d.get("n_candidates", 1),
            target_model=str(d.get("target_model", "")),
            target_vocab_fingerprint=str(d.get("target_vocab_fingerprint", "")),
            dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
        )

    @classmethod
    def from_file(cls, path: Path) -> "MLPSpeculatorConfig":
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot read the speculator config ({e})") from e
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: the speculator config is not a JSON object")
        try:
            return cls.from_dict(raw)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: {e}") from e


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, not {value!r}")


def _int_or(d: dict, name: str, default: int):
    value = d.get(name, default)
    _check_int(name, value, minimum=0)
    return value


# --------------------------------------------------------------------------- weights


def _read_files(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint directory, from whichever weight files it has."""
    return read_weight_files(path, WEIGHTS_NAME)


# a per-head tensor name: emb.3.weight -> ("emb", 3, "weight")
_HEAD_TENSOR = re.compile(r"^(emb|proj|head|ln)\.(\d+)\.(weight|bias)$")


def _shared_name(name: str) -> str | None:
    """Under tie_weights, the stored name of the tensor that `name` is a copy of (None: not a
    per-head copy). proj.0 is head 0's own; proj.2.. share proj.1; the rest share index 0."""
    m = _HEAD_TENSOR.match(name)
    if m is None:
        return None
    kind, i, what = m.group(1), int(m.group(2)), m.group(3)
    if kind == "proj":
        return f"proj.1.{what}" if i >= 2 else None
    return f"{kind}.0.{what}" if i >= 1 else None


def read_state_dict(path: Path, config: MLPSpeculatorConfig,
                    expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the names (and shapes) of `expected`.

    Strips the optional ``speculator.`` prefix. Under tie_weights, copies of a shared tensor
    stored under other head indices must equal it (they are then dropped). Missing, unexpected or
    misshapen tensors raise ValueError naming them.
    """
    raw = _read_files(Path(path))
    state = {(k[len(PREFIX):] if k.startswith(PREFIX) else k): v for k, v in raw.items()}
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"{path}: the weights lack {', '.join(missing)} "
                         f"(n_predict={config.n_predict}, tie_weights={config.tie_weights}, "
                         f"scale_input={config.scale_input})")
    out, unexpected = {}, []
    for name, tensor in state.items():
        if name in expected:
            out[name] = tensor
            continue
        shared = _shared_name(name) if config.tie_weights else None
        if shared is None or shared not in state:
            unexpected.append(name)
        elif not torch.equal(tensor, state[shared]):
            raise ValueError(f"{path}: tie_weights is true but {name} differs from {shared}")
    if unexpected:
        raise ValueError(f"{path}: unexpected tensors {', '.join(sorted(unexpected))} "
                         f"(n_predict={config.n_predict}, tie_weights={config.tie_weights}, "
                         f"scale_input={config.scale_input})")
    for name, tensor in out.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(f"{path}: {name} has shape {tuple(tensor.shape)}, the config "
                             f"(emb_dim={config.emb_dim}, inner_dim={config.inner_dim}, "
                             f"vocab_size={config.vocab_size}) gives "
                             f"{tuple(expected[name].shape)}")
    return out
