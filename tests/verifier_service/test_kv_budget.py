"""--gpu-memory-utilization F (verifier_service/kv/budget.py, model/memory.py): the KV cache gets
F x the device's memory less the weights, heads, workspace and graphs, in whole blocks; start-up
refuses in one line a model that does not fit or an F above what is free; on a CPU the cache is
sized by --kv-cache-memory-mb as before."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import planted_bugs as bug
import pytest
import torch
from transformers import AutoConfig

from splitspec.errors import StartupError
from verifier_service.config import VerifierConfig
from verifier_service.config_check import config_problems
from verifier_service.kv import budget as kvb
from verifier_service.kv.cache import KVCacheSpec
from verifier_service.model import memory

GIB = 1 << 30
SHAPES = Path(__file__).resolve().parents[2] / "models" / "shapes"
H200 = 140 * GIB


def block_bytes(shape: str, block_size: int = 16) -> int:
    cfg = AutoConfig.from_pretrained(SHAPES / shape)
    return KVCacheSpec.for_model(cfg, torch.bfloat16, block_size, 0, 1).bytes_per_token * block_size


def eight_b(**kw) -> kvb.MemoryBudget:
    parts = dict(total_bytes=H200, free_bytes=H200, utilization=0.9, weights_bytes=16 * GIB,
                 heads_bytes=GIB // 2, workspace_bytes=GIB, graphs_bytes=GIB // 2)
    return kvb.MemoryBudget(**{**parts, **kw})


def check_the_cache_and_the_rest_fit_in_f() -> None:
    b = eight_b()
    blocks = kvb.kv_blocks(b, block_bytes("llama-3.1-8b"))
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 128 KiB per token
    assert block_bytes("llama-3.1-8b") == 16 * 128 * 1024
    used = b.weights_bytes + b.heads_bytes + b.workspace_bytes + b.graphs_bytes
    assert used + blocks * block_bytes("llama-3.1-8b") <= 0.9 * H200
    assert used + (blocks + 1) * block_bytes("llama-3.1-8b") > 0.9 * H200  # whole blocks, all


def test_the_kv_cache_gets_what_f_leaves_in_whole_blocks():
    check_the_cache_and_the_rest_fit_in_f()
    assert kvb.fit_problem(eight_b(), block_bytes("llama-3.1-8b"), 16, 131072) is None


def test_the_check_catches_a_budget_that_forgets_the_weights(monkeypatch):
    bug.kv_budget_forgets_the_weights(monkeypatch)
    with pytest.raises(AssertionError):
        check_the_cache_and_the_rest_fit_in_f()


def test_a_model_that_does_not_fit_is_refused_in_one_line_naming_the_flags():
    small = eight_b(total_bytes=16 * GIB, free_bytes=16 * GIB)  # 8B weights on a 16 GiB card
    why = kvb.fit_problem(small, block_bytes("llama-3.1-8b"), 16, 4096)
    assert why and "\n" not in why and "does not fit" in why
    assert "--gpu-memory-utilization" in why and "--max-model-len" in why
    assert kvb.kv_blocks(small, block_bytes("llama-3.1-8b")) == 0
    # room for some blocks, but not one sequence of the context served
    tight = eight_b(weights_bytes=int(0.9 * H200) - 2 * GIB - GIB // 4)
    assert kvb.fit_problem(tight, block_bytes("llama-3.1-8b"), 16, 131072)
    assert kvb.fit_problem(tight, block_bytes("llama-3.1-8b"), 16, 1024) is None


def test_f_above_what_the_device_has_free_is_refused():
    why = kvb.fit_problem(eight_b(free_bytes=100 * GIB), block_bytes("llama-3.1-8b"), 16, 4096)
    assert why and "free" in why and "held by others" in why
    assert config_problems(VerifierConfig(gpu_memory_utilization=1.5))
    assert not config_problems(VerifierConfig(gpu_memory_utilization=0.9))


def test_the_budget_gathers_heads_workspace_and_graphs_from_the_shapes():
    """A tensor-parallel rank counts its share of the weights from the config (its shard is
    not on the device yet); an EAGLE head of the 8B's shape counts its tensors."""
    cfg = AutoConfig.from_pretrained(SHAPES / "llama-3.1-8b")
    config = VerifierConfig(gpu_memory_utilization=0.9, max_num_seqs=64,
                            eagle=str(SHAPES / "llama-3.1-8b-eagle3"))
    b = memory.kv_budget(config, cfg, torch.device("cpu"), torch.bfloat16, H200, H200, 8192, 2)
    assert b.weights_bytes == pytest.approx(8.03e9 * 2 / 2, rel=0.01)
    head = json.loads((SHAPES / "llama-3.1-8b-eagle3" / "config.json").read_text())
    assert b.heads_bytes > 2 * head["hidden_size"] * head["intermediate_size"] * 3
    assert b.workspace_bytes > 64 * 9 * head["vocab_size"] * 4  # the sampler's rows at least
    assert b.graphs_bytes == 0  # a CPU captures nothing
    with pytest.raises(StartupError, match="does not fit"):
        memory.kv_budget(dataclasses.replace(config, max_model_len=0), cfg, torch.device("cpu"),
                         torch.bfloat16, 8 * GIB, 8 * GIB, 131072, 2)


def test_on_a_cpu_the_cache_is_sized_by_kv_cache_memory_mb():
    from verifier_service.model.target import build_runner

    config = VerifierConfig(model=str(SHAPES / "tiny-llama"), load_format="dummy", threads=1,
                            gpu_memory_utilization=0.9, kv_cache_memory_mb=1)
    assert not memory.applies(config, torch.device("cpu"))
    runner, model, _ = build_runner(config)
    per_block = runner.kv.spec.bytes_per_token * config.block_size
    assert runner.kv.num_blocks == (1 << 20) // per_block and runner.memory_budget is None
