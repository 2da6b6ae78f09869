"""bench/gpu_scale.py's arithmetic: the bytes a decode step must read, and the tokens per step it
projects with, read from the committed real-model report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_scale  # noqa: E402


def test_an_8b_decode_step_reads_its_weights_but_the_embedding_and_the_cache():
    cfg = json.loads((ROOT / "models/shapes/llama-3.1-8b/config.json").read_text())
    kv_token = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16
    got = gpu_scale.step_bytes(cfg, 8, 4096, 2, kv_token)
    weights = (8_030_261_248 - 128_256 * 4096) * 2  # the input embedding is only indexed
    assert got == weights + 8 * 4096 * kv_token
    tied = json.loads((ROOT / "models/shapes/llama-3.2-1b/config.json").read_text())
    assert gpu_scale.step_bytes(tied, 1, 0, 2, 0) == 1_235_814_400 * 2  # the head is read


def test_tokens_per_step_come_from_the_real_models_report():
    tps = gpu_scale.real_tokens_per_step(ROOT / "bench/reports/bench-real.md")
    assert tps["off"] == pytest.approx(1.0)
    assert tps and all(0.5 <= t <= 17 for t in tps.values())
    assert any(name.startswith("eagle k=") for name in tps)
