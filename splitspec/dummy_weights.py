"""`--load-format dummy`: a model built from its config.json alone, with random weights.

vLLM's name and meaning: the architecture, shapes and dtype are the checkpoint's, the weights
are seeded uniform noise made on the device (nothing is read from disk but the config), so a
deployment's shape runs at its real speed with meaningless output. Speed is what it is for:
the step against the device's memory bandwidth (bench/gpu_scale.py), memory sizing
(--gpu-memory-utilization) and start-up at shapes whose weights are tens of gigabytes. The
shapes the project measures ship as config.json files under models/shapes/.

Weights: every parameter and floating buffer that is not recomputed (RoPE tables are) is drawn
from U(-1e-3, 1e-3), as vLLM does, parameters in name order from one generator on the weights'
device seeded with `seed`: the same seed gives the same model on the same device and dtype,
another seed another one. Norm weights drawn this small keep activations tiny, so no overflow
in half precision, and every logit is nearly equal: greedy output is some fixed token stream.

Tokenizer: a dummy directory normally has none. The model then gets a byte-level one
(`byte_tokenizer`): ids 0-255 are the 256 bytes (text in and out works, each byte one token),
every further id up to the config's vocab_size decodes as the placeholder `<id N>` and no text
encodes to it. It is a pure function of vocab_size, so a dummy draft model and a dummy target
of one vocabulary size (Llama-3.2-1B and Llama-3.1-8B: 128,256) have the same tokenizer
fingerprint and the verifier accepts the pair, as it would the real ones. A directory that
does hold a tokenizer (the real model's tokenizer.json beside its config) uses that one.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from splitspec.errors import BadModel

log = logging.getLogger("splitspec.model")

LOAD_FORMATS = ("auto", "dummy")
LOW, HIGH = -1e-3, 1e-3
MEANINGLESS = ("--load-format dummy: %s has random weights (seed %d); its output is "
               "meaningless, only its speed and memory are real")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


@torch.no_grad()
def fill_dummy_(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Overwrite `module`'s parameters (and its persistent floating buffers) with U(LOW, HIGH)
    noise from one generator seeded with `seed` on their device, in name order; returns it.
    Tied parameters (one tensor under two names) are drawn once."""
    seen: set[int] = set()
    gens: dict[torch.device, torch.Generator] = {}
    named = list(module.named_parameters(remove_duplicate=True))
    named += [(n, b) for n, b in module.named_buffers() if b.is_floating_point()
              and not n.endswith(("inv_freq", "original_inv_freq"))]
    for _, tensor in sorted(named, key=lambda nt: nt[0]):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        gen = gens.get(tensor.device)
        if gen is None:
            gen = gens[tensor.device] = torch.Generator(device=tensor.device)
            gen.manual_seed(seed)
        tensor.uniform_(LOW, HIGH, generator=gen)
    return module


def dummy_causal_lm(path: str | os.PathLike, device: torch.device, dtype: torch.dtype,
                    seed: int = 0, trust_remote_code: bool = False,
                    attn_implementation: str | None = "sdpa"):
    """The causal LM config.json in `path` describes, built on `device` in `dtype` with the
    dummy weights of `seed` (no weight file is read, none need exist). The caller checked that
    `path` is a local model directory (splitspec/modelio.py)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    p = Path(path)
    try:
        config = AutoConfig.from_pretrained(p, local_files_only=True,
                                            trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        raise BadModel(f"{p}: cannot read config.json: {exc}") from exc
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)  # made in the serving dtype: no float32 copy of 8B
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code,
                                                     **kwargs)
    finally:
        torch.set_default_dtype(default)
    model = model.to(dtype)
    fill_dummy_(model, seed)
    log.warning(MEANINGLESS, p.name, seed)
    return model.eval()


def has_tokenizer(path: str | os.PathLike) -> bool:
    return any((Path(path) / name).is_file() for name in TOKENIZER_FILES)


def placeholder(token_id: int) -> str:
    return f"<id {token_id}>"


def byte_tokenizer(vocab_size: int, eos_token_id: int | None = None):
    """A fast tokenizer of exactly `vocab_size` ids: the 256 bytes first (byte-level, so any
    text encodes), then placeholders `<id N>` no text encodes to (see the module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=_byte_of)
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    for i in range(len(vocab), vocab_size):
        vocab[_as_byte_level(placeholder(i))] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    if eos_token_id is not None and 0 <= eos_token_id < vocab_size:
        fast.eos_token = fast.convert_ids_to_tokens(eos_token_id)
    return fast


def _byte_level_map() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what tokenizers' ByteLevel uses)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    n, out = 0, {}
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


_BYTES = _byte_level_map()
_CHARS = {c: b for b, c in _BYTES.items()}


def _byte_of(ch: str) -> int:
    return _CHARS[ch]


def _as_byte_level(text: str) -> str:
    return "".join(_BYTES[b] for b in text.encode())


def parameter_count(cfg: dict) -> int:
    """Parameters of a Llama-family causal LM (llama, mistral, qwen2) from its config.json's
    values alone: the weights a decode step reads (bench/gpu_scale.py) and what a dummy load
    puts on the device. Qwen2's q/k/v projections have biases; a tied head counts once."""
    H, inner, V = int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["vocab_size"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    D = int(cfg.get("head_dim") or H // heads)
    attn = 2 * H * heads * D + 2 * H * kv * D
    if cfg.get("model_type") == "qwen2" or cfg.get("attention_bias"):
        attn += heads * D + 2 * kv * D
    layer = attn + 3 * H * inner + 2 * H
    head = 0 if cfg.get("tie_word_embeddings", False) else V * H
    return int(cfg["num_hidden_layers"]) * layer + V * H + head + H
