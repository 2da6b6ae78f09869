"""Shared pieces of the shipped model family: corpus, split, tokenizer, token streams, configs.

The corpus is the Python standard library of the interpreter running the script (found via
``sysconfig``), split *by file* into train and held-out sets with a fixed seed. Both
``train_models.py`` and ``eval_models.py`` import this module so that they agree on the split,
the document separator and the way token streams are built.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
EOS = "<|endoftext|>"  # document separator, BOS and EOS at once (GPT-2 convention)
PAD = "<|pad|>"


@dataclass(frozen=True)
class CorpusConfig:
    seed: int = 1234  # seeds the file shuffle that decides the split
    heldout_fraction: float = 0.05  # share of files held out (by file, never by line)
    max_file_bytes: int = 200_000  # skips a handful of generated tables / huge test files
    # Directories that are data rather than code (pydoc topics are prose; site-packages is not
    # stdlib).
    exclude_dirs: tuple[str, ...] = ("site-packages", "dist-packages", "pydoc_data", "__pycache__")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def list_corpus_files(cfg: CorpusConfig) -> list[Path]:
    """All usable .py files of the standard library, as a sorted (deterministic) list."""
    root = stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in cfg.exclude_dirs for part in rel.parts):
            continue
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if 0 < size <= cfg.max_file_bytes:
            files.append(path)
    return files


def split_files(cfg: CorpusConfig) -> tuple[list[Path], list[Path]]:
    """(train, heldout) file lists; the shuffle is seeded so the split is reproducible."""
    files = list_corpus_files(cfg)
    order = list(range(len(files)))
    random.Random(cfg.seed).shuffle(order)
    n_held = max(1, int(round(len(files) * cfg.heldout_fraction)))
    held = sorted(files[i] for i in order[:n_held])
    train = sorted(files[i] for i in order[n_held:])
    return train, held


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def read_texts(paths: list[Path]) -> list[str]:
    return [t for t in (read_text(p) for p in paths) if t and t.strip()]


def split_manifest(cfg: CorpusConfig) -> dict:
    """Describes the split precisely enough to check another machine reproduces it."""
    train, held = split_files(cfg)
    root = stdlib_root()
    rel = [str(p.relative_to(root)) for p in held]
    return {
        "stdlib": str(root),
        "python": sysconfig.get_python_version(),
        "n_train_files": len(train),
        "n_heldout_files": len(held),
        "heldout_files_sha256": hashlib.sha256("\n".join(rel).encode()).hexdigest(),
        "heldout_files": rel,
    }


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2 style pre-tokenisation, no prefix space), exact round trip."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def wrap_tokenizer(tok):
    """transformers fast tokenizer around a `tokenizers.Tokenizer`, ready for save_pretrained."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=None,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,  # keep decode(encode(x)) == x for source code
        model_max_length=512,
    )


def save_tokenizer(tokenizer, path: Path | str) -> None:
    """save_pretrained, then a portable tokenizer_config.json: the generic fast-tokenizer class
    (also loadable by transformers 4.x) and none of the loader's own flags (is_local, ...)."""
    path = Path(path)
    tokenizer.save_pretrained(str(path))
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("is_local", "local_files_only"):
        cfg.pop(key, None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_tokenizer(path: Path | str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def vocab_fingerprint(tokenizer) -> str:
    """sha256 over the sorted (token, id) pairs; equal fingerprints mean interchangeable
    vocabularies."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()


def encode_stream(tokenizer, texts: list[str]) -> np.ndarray:
    """One flat uint16 stream: doc0 <eos> doc1 <eos> ... (the EOS separates documents)."""
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    backend = tokenizer.backend_tokenizer if hasattr(tokenizer, "backend_tokenizer") else tokenizer
    encs = backend.encode_batch(texts, add_special_tokens=False)
    out = []
    for e in encs:
        out.extend(e.ids)
        out.append(eos_id)
    return np.asarray(out, dtype=np.uint16)


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class LlamaSize:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512


TARGET_SIZE = LlamaSize(
    hidden_size=512, num_hidden_layers=5, num_attention_heads=8, intermediate_size=1376
)
DRAFT_SIZE = LlamaSize(
    hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=384
)


def llama_config(size: LlamaSize, tokenizer):
    from transformers import LlamaConfig

    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    pad_id = tokenizer.convert_tokens_to_ids(PAD)
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_hidden_layers,
        num_attention_heads=size.num_attention_heads,
        num_key_value_heads=size.num_attention_heads,
        max_position_embeddings=size.max_position_embeddings,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,  # the 4k x H embedding is a large share of a small model
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        hidden_act="silu",
        attention_bias=False,
        initializer_range=0.02,
    )


def count_params(model) -> int:
    # tied weights are shared Parameters, so parameters() counts them once
    return sum(p.numel() for p in model.parameters())


def set_threads(n: int | None) -> int:
    import torch

    n = n or os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


# --------------------------------------------------------------------------- measurement


def fixed_windows(stream: np.ndarray, n: int, length: int):
    """n evenly spaced windows of length+1 tokens: a deterministic evaluation sample
    [n, length+1]."""
    import torch

    starts = np.linspace(0, len(stream) - length - 2, n).astype(np.int64)
    return torch.from_numpy(np.stack([stream[s : s + length + 1] for s in starts]).astype(np.int64))


def lm_loss(model, windows, batch: int = 8) -> float:
    """Mean next-token cross entropy (nats/token) over windows [N, L+1]."""
    import torch
    import torch.nn.functional as F

    was_training = model.training
    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            w = windows[i : i + batch]
            logits = model(input_ids=w[:, :-1]).logits.float()
            tot += F.cross_entropy(
                logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1), reduction="sum"
            ).item()
            n += w[:, 1:].numel()
    model.train(was_training)
    return tot / n


def heldout_sample(cfg: CorpusConfig, max_bytes: int = 24_000) -> list[dict]:
    """A few small held-out files (sorted by path, 1-8 kB each) shipped for fast tests."""
    _, held = split_files(cfg)
    root = stdlib_root()
    out, total = [], 0
    for path in held:
        text = read_text(path)
        if not text or not 1_000 <= len(text.encode()) <= 8_000:
            continue
        out.append({"path": str(path.relative_to(root)), "text": text})
        total += len(text.encode())
        if total >= max_bytes:
            break
    return out


def sample_windows(tokenizer, texts: list[str], length: int = 512):
    """Token stream of the sample cut into non-overlapping windows of length+1 tokens
    [N, length+1]."""
    import torch

    ids = encode_stream(tokenizer, texts).astype(np.int64)
    n = (len(ids) - 1) // length
    return torch.stack(
        [torch.from_numpy(ids[i * length : i * length + length + 1]) for i in range(n)]
    )


def mlp_head_accuracy(target, spec, windows) -> list[float]:
    """Teacher-forced top-1 accuracy of each speculator head against the text of windows [N, L+1].

    Head i at position t sees the target's final hidden state h_t and tokens x_{t+1..t+1+i} and
    predicts x_{t+2+i}.
    """
    import torch

    n = spec.config.n_predict
    correct, total = torch.zeros(n), 0
    with torch.no_grad():
        for w in windows.split(4):
            h = target.model(input_ids=w).last_hidden_state.to(spec.head[0].weight.dtype)
            lo, hi = 0, w.size(1) - n - 1
            for j, lg in enumerate(spec.teacher_forced_logits(h[:, lo:hi], w, lo, hi)):
                correct[j] += (lg.argmax(-1) == w[:, lo + 2 + j : hi + 2 + j]).sum()
            total += w.size(0) * (hi - lo)
    return (correct / total).tolist()


def greedy_continue(model, prompts, n_new: int):
    """Plain greedy decoding with the KV cache: prompts [B, P] -> [B, P + n_new].

    No logits processors and no stop on EOS (an EOS is just a token that starts a new document),
    so this is exactly the target's argmax chain that greedy speculative decoding must reproduce.
    """
    import torch

    with torch.no_grad():
        out = model(input_ids=prompts, use_cache=True)
        toks = [out.logits[:, -1].argmax(-1, keepdim=True)]
        for _ in range(n_new - 1):
            out = model(input_ids=toks[-1], past_key_values=out.past_key_values, use_cache=True)
            toks.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat([prompts, *toks], 1)


def run_stages(parser, names: str, known: tuple[str, ...], stages: dict, a, log,
               label: str = "") -> None:
    """Run the comma-separated stages `names` in order (parser.error on an unknown one): each
    stages[name](a), logged with its wall-clock minutes."""
    import time

    for s in names.split(","):
        if s not in known:
            parser.error(f"unknown stage {s!r}")
        t0 = time.time()
        log(f"=== {label}stage {s}")
        stages[s](a)
        log(f"=== {label}stage {s} done in {(time.time() - t0) / 60:.1f} min")

