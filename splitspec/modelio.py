"""Loading models and tokenizers from a local directory with transformers (never from a hub)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch


def _require_local_dir(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{p} is not a model directory (no config.json); "
                                "splitspec loads models from local directories only")
    return p


def load_tokenizer(path: str | os.PathLike, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_require_local_dir(path), local_files_only=True,
                                         trust_remote_code=trust_remote_code)


def load_causal_lm(path: str | os.PathLike, device: torch.device, dtype: torch.dtype,
                   trust_remote_code: bool = False, attn_implementation: str | None = "sdpa"):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        _require_local_dir(path), local_files_only=True, trust_remote_code=trust_remote_code,
        dtype=dtype, attn_implementation=attn_implementation)
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
