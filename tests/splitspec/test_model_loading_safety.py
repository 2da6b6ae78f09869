"""Models load from safetensors only: a checkpoint that is a pickle (pytorch_model.bin, which
could run code when loaded) is refused with a one-line error naming the directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from splitspec.errors import BadModel
from splitspec.modelio import load_causal_lm


def test_a_pickled_checkpoint_is_refused(tiny_target_dir, tmp_path):
    model = load_causal_lm(tiny_target_dir, torch.device("cpu"), torch.float32)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(Path(tiny_target_dir) / "config.json", pickled / "config.json")
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")  # the legacy pickle format
    with pytest.raises(BadModel, match=str(pickled)):
        load_causal_lm(pickled, torch.device("cpu"), torch.float32)
    # the same weights as safetensors load
    shutil.copy(Path(tiny_target_dir) / "model.safetensors", pickled / "model.safetensors")
    assert load_causal_lm(pickled, torch.device("cpu"), torch.float32) is not None
