"""`splitspec import-gguf`: a GGUF file written here from the tiny Llama fixture comes back as a
model directory with the source's logits, tokenizer and chat template, which the verifier
serves with the same greedy tokens as transformers' own generate."""

from __future__ import annotations

import asyncio
import json
import shutil

import numpy as np
import pytest
import torch
from gguf_testlib import CHAT_TEMPLATE, write_llama_gguf
from tiny_proposer_models import TINY_TARGET
from transformers import AutoModelForCausalLM, AutoTokenizer

from protos import common_pb2
from splitspec import launcher
from splitspec.gguf_import import IMPORT_RECORD, GgufImportError, import_gguf, import_record
from verifier_service.prompt import PromptEncoder

TEXTS = ["def add(a, b):\n    return a + b\n", "\tclass  Foo:\r\n  pass # é ü 😀",
         "<|endoftext|>import os<|endoftext|>"]


def _load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(source dir, GGUF path, imported dir): the fixture as an F32 GGUF, imported in float32."""
    tmp = tmp_path_factory.mktemp("gguf")
    gguf = write_llama_gguf(TINY_TARGET, tmp / "tiny.gguf")
    out = import_gguf(gguf, tmp / "tiny-imported", dtype="float32", log=lambda _: None)
    return TINY_TARGET, gguf, out


def test_imported_model_has_the_source_logits(imported):
    src, _, out = imported
    x = torch.randint(0, 1024, (2, 24), generator=torch.Generator().manual_seed(0))  # [B, T]
    with torch.inference_mode():
        want, got = _load(src)(x).logits, _load(out)(x).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is True
    assert "quantization_config" not in cfg  # dense weights: loads without the GGUF
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 0


def test_imported_tokenizer_and_chat_template(imported):
    src, gguf, out = imported
    want, got = AutoTokenizer.from_pretrained(src), AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        ids = got.encode(text, add_special_tokens=False)
        assert ids == want.encode(text, add_special_tokens=False)
        assert got.decode(ids) == text
    assert got.chat_template == CHAT_TEMPLATE
    record = import_record(out)
    assert record["source"] == gguf.name and record["dtype"] == "float32"

    # the verifier renders chat requests through the model's own template
    req = common_pb2.GenerateRequest()
    req.options.messages.add(role="user", content="hello")
    encoder = PromptEncoder(got, max_model_len=2048)
    try:
        ids = asyncio.run(encoder.encode(req))
    finally:
        encoder.close()
    assert got.decode(ids) == "<|endoftext|>user\nhello\n<|endoftext|>assistant\n"


def test_f16_gguf_gives_the_f16_rounded_weights(imported, tmp_path):
    src, _, _ = imported
    gguf = write_llama_gguf(src, tmp_path / "tiny-f16.gguf", dtype=np.float16)
    out = import_gguf(gguf, tmp_path / "imported", dtype="float32", log=lambda _: None)
    rounded = _load(src)
    with torch.no_grad():
        for p in rounded.parameters():
            if p.ndim == 2:  # norms are written F32
                p.copy_(p.half().float())
    x = torch.arange(30)[None]  # [1, T]
    with torch.inference_mode():
        torch.testing.assert_close(_load(out)(x).logits, rounded(x).logits,
                                   rtol=1e-5, atol=1e-5)


def test_a_second_import_does_nothing_and_other_directories_are_kept(imported, tmp_path):
    _, gguf, out = imported
    before = (out / "model.safetensors").stat().st_mtime_ns
    said = []
    assert import_gguf(gguf, out, dtype="float32", log=said.append) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == before
    assert "already" in said[0]

    other = tmp_path / "other"
    shutil.copytree(TINY_TARGET, other)
    with pytest.raises(GgufImportError, match="--force"):
        import_gguf(gguf, other, dtype="float32")
    assert not (other / IMPORT_RECORD).exists()


def test_cli_subcommand(imported, tmp_path, capsys):
    _, gguf, _ = imported
    with pytest.raises(SystemExit) as exit_:
        launcher.main(["import-gguf", str(gguf), str(tmp_path / "m"), "--dtype", "float16"])
    assert exit_.value.code == 0
    assert json.loads((tmp_path / "m" / "config.json").read_text())["dtype"] == "float16"
    assert not list(tmp_path.glob(".m.*"))  # nothing left beside it
    capsys.readouterr()

    with pytest.raises(SystemExit) as exit_:
        launcher.main(["import-gguf", str(tmp_path / "missing.gguf"), str(tmp_path / "n")])
    assert exit_.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "missing.gguf: no such file" in err
    assert not (tmp_path / "n").exists()


def test_launcher_starts_no_toy_proposer_for_an_imported_model(imported, tmp_path):
    """Imported beside the toy family's draft and MLP speculator, which were trained for another
    tokenizer and hidden size: `splitspec up` leaves both out (n-gram and suffix always run)."""
    _, _, out = imported
    models = tmp_path / "models"
    models.mkdir()
    for name in ("target", "draft", "mlp-speculator"):
        (models / name).symlink_to(launcher.REPO_ROOT / "models" / name)
    (models / "imported").symlink_to(out)
    assert launcher.sibling_proposer_models(models / "imported") == {}
    assert set(launcher.sibling_proposer_models(models / "target")) == {"draft", "mlp"}
