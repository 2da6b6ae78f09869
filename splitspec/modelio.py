"""Loading models and tokenizers from a local directory with transformers (never from a hub)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from splitspec.errors import BadModel


def require_local_dir(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise BadModel(f"{p} is not a model directory (no config.json); "
                       "splitspec loads models from local directories only")
    return p


def _loading(path, what: str, load):
    """load(), with a broken directory (bad config, weights missing or not safetensors)
    reported as BadModel naming it."""
    try:
        return load()
    except (OSError, ValueError, KeyError) as exc:
        if isinstance(exc, BadModel):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BadModel(f"{path}: cannot load the {what}: {first}") from exc


def read_weight_files(path: Path, weights_name: str = "model.safetensors"
                      ) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory, from whichever weight files it has: one
    safetensors file, a sharded one (model.safetensors.index.json) or pytorch_model.bin (read
    with weights_only). ValueError when it has none."""
    import json

    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if (path / weights_name).is_file():
        return load_file(str(path / weights_name))
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(str(path / shard)).items()}
    if (path / "pytorch_model.bin").is_file():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ValueError(f"{path}: no {weights_name}, model.safetensors.index.json or "
                     "pytorch_model.bin")


def load_tokenizer(path: str | os.PathLike, trust_remote_code: bool = False,
                   load_format: str = "auto"):
    """The directory's tokenizer; under --load-format dummy a directory without one gets the
    byte-level tokenizer of its config's vocab_size (splitspec/dummy_weights.py)."""
    from transformers import AutoTokenizer

    p = require_local_dir(path)
    if load_format == "dummy":
        from splitspec import dummy_weights
        if not dummy_weights.has_tokenizer(p):
            import json
            cfg = json.loads((p / "config.json").read_text())
            eos = cfg.get("eos_token_id")
            return dummy_weights.byte_tokenizer(int(cfg["vocab_size"]),
                                                eos if isinstance(eos, int) else None)
    return _loading(p, "tokenizer", lambda: AutoTokenizer.from_pretrained(
        p, local_files_only=True, trust_remote_code=trust_remote_code))


def load_causal_lm(path: str | os.PathLike, device: torch.device, dtype: torch.dtype,
                   trust_remote_code: bool = False, attn_implementation: str | None = "sdpa",
                   load_format: str = "auto", seed: int = 0):
    """The directory's causal LM on `device`; load_format "dummy": built from its config.json
    alone with random weights of `seed` (splitspec/dummy_weights.py)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    p = require_local_dir(path)
    if load_format == "dummy":
        from splitspec.dummy_weights import dummy_causal_lm
        return dummy_causal_lm(p, device, dtype, seed, trust_remote_code, attn_implementation)
    # safetensors only: a pickled checkpoint (pytorch_model.bin) could run code when loaded
    model = _loading(p, "model", lambda: AutoModelForCausalLM.from_pretrained(
        p, local_files_only=True, trust_remote_code=trust_remote_code, use_safetensors=True,
        dtype=dtype, attn_implementation=attn_implementation))
    return model.to(device).eval()


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary (token -> id): equal iff proposer and target agree on ids."""
    vocab = tokenizer.get_vocab()
    h = hashlib.sha256()
    for token, idx in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def model_name(path: str | os.PathLike) -> str:
    return Path(path).resolve().name
