"""The KV cache's size under `--gpu-memory-utilization F` on an accelerator: the numbers of
verifier_service/kv/budget.py gathered from the device, the loaded target and the configuration.

Measured: the device's total and free memory before the target loads, and what its weights hold
once loaded (a tensor-parallel rank, whose shard reaches the device only after the cache exists,
counts its share of the weights from the config instead). Budgeted from the shapes: an EAGLE head
(its tensors from its config.json), the step's workspace (the longest prefill chunk, the sampler
over every row of the largest step) and the captured graphs' pool (the largest bucket of the
ladder the executor will capture). After warm-up `report_graphs` logs what the graphs measured
beside their budget. On the CPU the cache is sized by --kv-cache-memory-mb, as it always was.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from splitspec import device as dev
from splitspec.dummy_weights import parameter_count
from splitspec.errors import StartupError
from verifier_service.config import VerifierConfig
from verifier_service.kv import budget as kvb
from verifier_service.kv.cache import KVCacheSpec
from verifier_service.methods.eagle import dummy as eagle_dummy
from verifier_service.step.plan import BucketLadder

log = logging.getLogger("splitspec.verifier")


def applies(config: VerifierConfig, device: torch.device) -> bool:
    """Whether F sizes the cache: on an accelerator, with F set and no explicit block count."""
    return (config.gpu_memory_utilization > 0 and device.type != "cpu"
            and config.num_kv_blocks == 0)


def kv_budget(config: VerifierConfig, model_config, device: torch.device, dtype: torch.dtype,
              free_before: int, total: int, max_model_len: int,
              tensor_parallel_size: int = 1) -> kvb.MemoryBudget:
    """The budget of this process's device (StartupError, one line, when the model does not
    fit); its kv_bytes is the KV cache's memory."""
    itemsize = dtype.itemsize
    if tensor_parallel_size > 1:
        weights = parameter_count(model_config.to_dict()) * itemsize // tensor_parallel_size
    else:
        weights = dev.memory_allocated(device)
    hidden, inner = model_config.hidden_size, model_config.intermediate_size
    vocab = model_config.vocab_size
    rows = 1 + config.max_num_speculative_tokens
    step_rows = config.max_num_seqs * rows
    chunk = config.max_num_batched_tokens or max_model_len
    ladder = (BucketLadder.powers_of_two(config.max_num_seqs, rows)
              if config.graphs != "off" and dev.supports_graphs(device) else BucketLadder())
    largest = max(ladder.seqs, default=0) * max(ladder.rows, default=0)
    budget = kvb.MemoryBudget(
        total_bytes=total, free_bytes=free_before, utilization=config.gpu_memory_utilization,
        weights_bytes=weights, heads_bytes=head_bytes(config.eagle, itemsize),
        workspace_bytes=kvb.step_workspace_bytes(max(chunk, step_rows), step_rows, hidden,
                                                 inner, vocab, itemsize),
        graphs_bytes=kvb.graphs_bytes(largest, len(ladder), hidden, inner, vocab, itemsize))
    spec = KVCacheSpec.for_model(model_config, dtype, config.block_size, 0, 1,
                                 tensor_parallel_size=tensor_parallel_size)
    block_bytes = spec.bytes_per_token * config.block_size
    problem = kvb.fit_problem(budget, block_bytes, config.block_size, max_model_len)
    if problem:
        raise StartupError(problem)
    log.info("--gpu-memory-utilization %s; %d KV blocks of %d tokens", budget.describe(),
             kvb.kv_blocks(budget, block_bytes), config.block_size)
    return budget


def head_bytes(path: str, itemsize: int) -> int:
    """An EAGLE head's tensors from its config.json (0: none, or a config that cannot be read:
    the head's own start-up says why)."""
    if not path:
        return 0
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
        n = sum(_numel(shape) for shape in eagle_dummy.shapes(cfg).values())
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    return n * itemsize


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def report_graphs(budget: kvb.MemoryBudget | None, measured_bytes: int) -> None:
    """After capture: the graphs' measured pool beside its budget (a warning when over it: the
    KV cache then had that much less room than F meant)."""
    if budget is None or not measured_bytes:
        return
    over = measured_bytes > budget.graphs_bytes
    (log.warning if over else log.info)(
        "captured graphs hold %.1f MiB, budgeted %.1f MiB under --gpu-memory-utilization%s",
        measured_bytes / 2**20, budget.graphs_bytes / 2**20,
        " (over: lower --gpu-memory-utilization or --max-num-seqs)" if over else "")
