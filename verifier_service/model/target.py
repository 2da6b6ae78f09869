"""The target as this verifier process holds it: the model loaded onto its device, its paged KV
cache and its ModelRunner. A tensor-parallel rank (verifier_service/tp/worker.py) holds its shard
of the weights and the KV cache of its KV heads; every rank builds the same way, and rank 0 also
keeps whole the vocabulary tables an EAGLE head drafting there reads.
"""

from __future__ import annotations

import torch

from splitspec.device import memory_info, resolve_device, resolve_dtype
from splitspec.modelio import load_causal_lm
from splitspec.tensor_parallel import TPGroup
from verifier_service.config import VerifierConfig
from verifier_service.kv.cache import KVCacheSpec, PagedKVCache
from verifier_service.kv.journal import JournaledKVCache
from verifier_service.kv.paged_attention import ATTENTION_NAME
from verifier_service.kv.paged_attention import register as register_paged_attention
from verifier_service.methods.eagle import checkpoint as eagle_format
from verifier_service.methods.eagle import dummy as eagle_dummy
from verifier_service.model import memory, quantization
from verifier_service.model.runner import ModelRunner


def build_runner(config: VerifierConfig, group: TPGroup | None = None):
    """Load the target onto this process's device (a tensor-parallel rank: its shard, with the
    KV cache of its KV heads); returns (runner, model, dtype). Every rank builds the same."""
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    device = group.device if group is not None else resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    # refused here, before the model loads, where the quantized product cannot run
    linear = quantization.linear_backend(config.linear, config.quantization, device, dtype)
    register_paged_attention()
    tp = group.size if group is not None else 1
    free_before, total = memory_info(device)  # before anything of this process is there
    # a sharded target is read on the host and only each rank's shard goes to its device
    model = load_causal_lm(config.model, torch.device("cpu") if tp > 1 else device, dtype,
                           config.trust_remote_code, attn_implementation=ATTENTION_NAME,
                           load_format=config.load_format, seed=config.load_seed)
    kv_cls = JournaledKVCache if tp > 1 and group.leader else PagedKVCache
    max_len = config.max_model_len or getattr(model.config, "max_position_embeddings", 2048)
    budget, kv_bytes = None, config.kv_cache_memory_mb << 20
    if memory.applies(config, device):  # --gpu-memory-utilization: what F leaves
        budget = memory.kv_budget(config, model.config, device, dtype, free_before, total,
                                  max_len, tp)
        kv_bytes = budget.kv_bytes
    kv = kv_cls(KVCacheSpec.for_model(model.config, dtype, config.block_size, kv_bytes,
                                      config.num_kv_blocks, tensor_parallel_size=tp), device)
    runner = ModelRunner(model, device, kv, linear=linear, max_model_len=max_len,
                         tensor_parallel=group, keep_whole=_drafting_tables(config, group))
    runner.memory_budget = budget  # the warm-up holds the graphs' measured pool against it
    return runner, model, dtype


def _drafting_tables(config: VerifierConfig, group: TPGroup | None) -> tuple[str, ...]:
    """The vocabulary tables rank 0 of a tensor-parallel target keeps whole for the EAGLE
    head that drafts there alone (eagle_format.target_tables); none elsewhere, or for a head
    that does not load (the method's start-up says why)."""
    if not config.eagle or group is None or group.size < 2 or not group.leader:
        return ()
    try:
        spec, weights = eagle_dummy.load(config.eagle, config.load_format, config.load_seed)
    except ValueError:
        return ()
    return eagle_format.target_tables(spec, weights)
