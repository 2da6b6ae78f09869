"""A GGUF file -> a local Hugging Face model directory that splitspec serves.

    splitspec import-gguf MODEL.gguf OUT_DIR [--dtype float16] [--force]

transformers reads the GGUF (`gguf_file=` in from_pretrained: architecture, weights dequantized,
tokenizer with its chat template, special tokens); this writes what every splitspec service
loads: config.json, generation_config.json, model.safetensors, the tokenizer files (the chat
template included) and gguf-import.json, which records the source file's sha256. The directory
is written beside OUT_DIR and renamed into place only once the written model has been loaded
back and gives the same logits as the one read from the GGUF, so OUT_DIR is never half written.
Importing the same file into the same directory again does nothing.

Quantized tensors (Q4_1, Q8_0, K-quants, ...) are dequantized: the result is a dense checkpoint
in --dtype (float16 by default: half the disk of float32; the verifier upcasts on a CPU).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

IMPORT_RECORD = "gguf-import.json"
# torch and transformers are imported when an import runs: the `splitspec` CLI that offers this
# subcommand starts the services and needs neither itself.
DTYPES = ("float16", "bfloat16", "float32")
# Text the check feeds both models: any tokenizer encodes it to a few tokens.
_CHECK_TEXT = "def add(a, b):\n    return a + b\n"


class GgufImportError(Exception):
    """An import that cannot be done; its message is one line for the user."""


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def import_record(out: str | Path) -> dict | None:
    """The record of the import that wrote `out`, or None when `out` is not one."""
    try:
        return json.loads((Path(out) / IMPORT_RECORD).read_text())
    except (OSError, ValueError):
        return None


def read_gguf(gguf: Path):
    """(model in float32, tokenizer) as transformers reads them from the GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  local_files_only=True)
        # dequantize: a dense model even where a GGUF matmul kernel could keep the blocks
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, local_files_only=True, dtype=torch.float32,
            quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True))
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise GgufImportError(f"{gguf}: transformers cannot read it: {first}") from exc
    # The weights are dense now: no GGUF marker may remain, or the written config would ask
    # every later load for the GGUF file.
    model.config.__dict__.pop("quantization_config", None)
    for attr in ("hf_quantizer", "quantization_method"):
        model.__dict__.pop(attr, None)
    model.is_quantized = False
    model.config.name_or_path = ""
    return model.eval(), tokenizer


def _check_written(written: Path, model, tokenizer, ids: list[int], want) -> float:
    """Load the written directory as the services do: the tokenizer must encode as the GGUF's,
    the chat template be there, every weight be the model's exactly. Returns the largest
    absolute difference of its logits on `ids` from `want` [1, T, V], the logits of the model
    as read from the GGUF (float32)."""
    import torch

    from splitspec.modelio import load_causal_lm, load_tokenizer

    loaded_tok = load_tokenizer(written)
    if loaded_tok.encode(_CHECK_TEXT, add_special_tokens=False) != ids:
        raise GgufImportError(f"{written}: the written tokenizer encodes differently")
    if getattr(loaded_tok, "chat_template", None) != getattr(tokenizer, "chat_template", None):
        raise GgufImportError(f"{written}: the chat template was not written")
    loaded = load_causal_lm(written, torch.device("cpu"), torch.float32,
                            attn_implementation=model.config._attn_implementation)
    params = dict(model.named_parameters())
    for name, p in loaded.named_parameters():  # buffers (RoPE frequencies) are recomputed
        if name not in params or not torch.equal(p, params[name].float()):
            raise GgufImportError(f"{written}: weight {name} was not written as read")
    with torch.inference_mode():
        got = loaded(torch.tensor([ids])).logits  # [1, T, V]
    return (got - want).abs().max().item()


def import_gguf(gguf: str | Path, out: str | Path, dtype: str = "float16",
                force: bool = False, log=print) -> Path:
    """Import `gguf` into the directory `out` (see the module docstring); returns `out`."""
    gguf, out = Path(gguf), Path(out)
    if dtype not in DTYPES:
        raise GgufImportError(f"--dtype must be one of {', '.join(DTYPES)}")
    if not gguf.is_file():
        raise GgufImportError(f"{gguf}: no such file")
    digest = sha256_file(gguf)
    record = import_record(out)
    if record and record.get("sha256") == digest and record.get("dtype") == dtype:
        log(f"{out} is already the import of {gguf.name}")
        return out
    if out.exists() and not force:
        raise GgufImportError(f"{out} exists and is not an import of {gguf.name} "
                              f"in {dtype} (--force replaces it)")
    # no progress bar for the dequantizing loop (tqdm reads this when first imported)
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch

    started = time.monotonic()
    model, tokenizer = read_gguf(gguf)
    ids = tokenizer.encode(_CHECK_TEXT, add_special_tokens=False)
    with torch.inference_mode():
        want = model(torch.tensor([ids])).logits  # [1, T, V] float32, as read
    model.to(getattr(torch, dtype))
    staging = out.with_name(f".{out.name}.importing")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        model.save_pretrained(staging)  # config, generation config, model.safetensors
        tokenizer.save_pretrained(staging)  # tokenizer.json, tokenizer_config, chat template
        diff = _check_written(staging, model, tokenizer, ids, want)
        if dtype == "float32" and diff > 1e-4 * max(1.0, want.abs().max().item()):
            raise GgufImportError(f"{staging}: the written model's logits differ from the "
                                  f"GGUF's by up to {diff:.3g}")
        from importlib.metadata import version

        (staging / IMPORT_RECORD).write_text(json.dumps({
            "source": gguf.name, "sha256": digest, "dtype": dtype,
            "parameters": sum(p.numel() for p in model.parameters()),
            "transformers": version("transformers"), "gguf": version("gguf"),
        }, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"imported {gguf.name} ({model.config.model_type}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {dtype}) into "
        f"{out} in {time.monotonic() - started:.0f} s; its logits within {diff:.2g} of the GGUF's")
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("gguf", type=Path, help="the GGUF file")
    ap.add_argument("out", type=Path, help="the model directory to write")
    ap.add_argument("--dtype", default="float16", choices=DTYPES,
                    help="the written weights' dtype (default: float16)")
    ap.add_argument("--force", action="store_true",
                    help="replace OUT when it holds something else (default: off)")


def run(args: argparse.Namespace) -> int:
    try:
        import_gguf(args.gguf, args.out, args.dtype, args.force)
    except GgufImportError as exc:
        print(f"splitspec import-gguf: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="splitspec import-gguf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
