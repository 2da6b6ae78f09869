"""scripts/train_models.py end to end at toy sizes: every stage after the tokenizer runs, writes
loadable fp16 checkpoints with their training records, and a target run can be continued.

The tokenizer is the shipped one and the corpus a few stdlib files, so the whole pipeline takes
seconds; the real run (`make models`) only differs in sizes, step counts and data.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SHIPPED_TOKENIZER = REPO / "models" / "target"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(
        f"{name}_under_test", REPO / "scripts" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through it
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return module


@pytest.fixture(scope="module")
def train_models():
    return load_script("train_models")


@pytest.fixture(scope="module")
def work(tmp_path_factory, train_models) -> Path:
    """A scratch dir as the tokenizer and data stages leave it, built from a few stdlib files."""
    mf = train_models.mf
    if not (SHIPPED_TOKENIZER / "tokenizer.json").is_file():
        pytest.skip("models/target is not built (make models)")
    work = tmp_path_factory.mktemp("work")
    (work / "tokenizer").mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHIPPED_TOKENIZER / f, work / "tokenizer" / f)
    tok = mf.load_tokenizer(work / "tokenizer")
    (work / "data").mkdir()
    stdlib = mf.stdlib_root()
    for name, files in (("train", ["argparse.py", "dataclasses.py"]), ("heldout", ["textwrap.py"])):
        ids = mf.encode_stream(tok, mf.read_texts([stdlib / f for f in files]))
        assert ids.dtype == np.uint16 and len(ids) > 4096
        ids.tofile(work / "data" / f"{name}.bin")
    return work


def toy_args(out: Path, work: Path, *extra: str) -> list[str]:
    return [
        "--out",
        str(out),
        "--work",
        str(work),
        "--threads",
        "1",
        "--sequential",
        "--target-size",
        "64,1,2,128",
        "--target-steps",
        "3",
        "--target-batch",
        "2",
        "--draft-size",
        "32,1,2,64",
        "--draft-steps",
        "3",
        "--draft-batch",
        "2",
        "--distill-prompts",
        "8",
        "--mlp-steps",
        "3",
        "--mlp-corpus-windows",
        "4",
        *extra,
    ]


def test_every_stage_writes_a_loadable_checkpoint(train_models, work, tmp_path):
    from transformers import AutoModelForCausalLM

    from proposer_service.mlp.speculator import MLPSpeculator

    out = tmp_path / "models"
    train_models.main(toy_args(out, work, "--stages", "target,distill,draft,mlp"))

    fingerprint = train_models.mf.vocab_fingerprint(
        train_models.mf.load_tokenizer(work / "tokenizer")
    )
    for name, steps in (("target", 3), ("draft", 3)):
        model = AutoModelForCausalLM.from_pretrained(out / name, local_files_only=True)
        assert model.dtype == torch.float16 and model.config.hidden_size in (64, 32)
        record = json.loads((out / name / "training.json").read_text())
        assert record["steps_done"] == steps and record["vocab_fingerprint"] == fingerprint
        assert record["tokens_seen"] == steps * 2 * 512
    distill = torch.load(work / "data" / "distill.pt")
    assert distill["seqs"].shape == (8, 64 + 128)  # prompts, each prompt + its greedy continuation
    spec = MLPSpeculator.from_pretrained(out / "mlp-speculator", dtype=torch.float32)
    assert spec.config.emb_dim == 64 and spec.config.target_vocab_fingerprint == fingerprint


def test_draft_can_train_on_the_corpus_alone(train_models, work, tmp_path):
    out = tmp_path / "models"
    train_models.main(toy_args(out, work, "--stages", "target"))
    (work / "data" / "distill.pt").unlink(missing_ok=True)
    train_models.main(
        toy_args(out, work, "--stages", "distill,draft", "--draft-distill-share", "0.5")
    )
    assert "continuations" in json.loads((out / "draft" / "training.json").read_text())["data"]
    train_models.main(toy_args(out, work, "--stages", "draft", "--draft-distill-share", "0"))
    assert json.loads((out / "draft" / "training.json").read_text())["data"] == "corpus windows"


def test_a_target_run_continues_where_the_last_one_stopped(train_models, work, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "models"
    train_models.main(toy_args(out, work, "--stages", "target"))
    first = AutoModelForCausalLM.from_pretrained(out / "target", local_files_only=True)
    train_models.main(
        toy_args(
            out,
            work,
            "--stages",
            "target",
            "--target-init",
            str(out / "target"),
            "--target-steps",
            "2",
        )
    )
    record = json.loads((out / "target" / "training.json").read_text())
    assert record["steps_done"] == 5 and record["tokens_seen"] == 5 * 2 * 512
    assert [r["steps_done"] for r in record["runs"]] == [3, 2]
    again = AutoModelForCausalLM.from_pretrained(out / "target", local_files_only=True)
    w0 = first.model.embed_tokens.weight
    w1 = again.model.embed_tokens.weight
    assert not torch.equal(w0, w1)  # trained further
    assert (
        w1.float() - w0.float()
    ).abs().max() < 0.1  # from the first run's weights, not from scratch
