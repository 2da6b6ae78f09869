"""Golden test: the paged, packed ragged-batch forward gives the same logits as the plain
transformers forward of each sequence alone, for Llama, Mistral and Qwen2."""

from __future__ import annotations

import pytest
import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from verifier_service.kv_cache import BlockTable, KVCacheSpec, OutOfBlocks, PagedKVCache
from verifier_service.model_runner import ModelRunner, SeqForward
from verifier_service.paged_attention import ATTENTION_NAME, register

SMALL = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def _pair(tmp_path, cls, config):
    torch.manual_seed(0)
    cls(config).save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    register()
    paged = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                 attn_implementation=ATTENTION_NAME).eval()
    return plain, paged


@pytest.mark.parametrize("cls, config", [
    (LlamaForCausalLM, LlamaConfig(**SMALL)),
    (MistralForCausalLM, MistralConfig(**SMALL, sliding_window=12)),
    (Qwen2ForCausalLM, Qwen2Config(**SMALL)),
], ids=["llama", "mistral-sliding-window", "qwen2"])
def test_paged_ragged_logits_equal_plain_forward(tmp_path, cls, config):
    plain, paged = _pair(tmp_path, cls, config)
    kv = PagedKVCache(KVCacheSpec.for_model(paged.config, torch.float32, block_size=4,
                                            memory_bytes=0, num_blocks=64), torch.device("cpu"))
    runner = ModelRunner(paged, torch.device("cpu"), kv)
    g = torch.Generator().manual_seed(1)
    lengths, ks = [5, 17, 31, 9], [0, 3, 6, 1]
    seqs = [torch.randint(0, config.vocab_size, (n + k,), generator=g).tolist()
            for n, k in zip(lengths, ks)]
    tables = [BlockTable() for _ in seqs]

    # Step 1: prefill all but the last 2 tokens of the first three; the fourth is not there yet.
    step1 = [SeqForward(t, s[:n - 2], 0, 1) for t, s, n in zip(tables[:3], seqs, lengths)]
    for f in step1:
        kv.reserve(f.table, len(f.input_ids))
    runner.forward(step1)

    # Step 2, ragged: 2 uncached tokens + k drafts each, and a brand-new sequence's prefill.
    step2 = [SeqForward(t, s[n - 2:], n - 2, k + 1)
             for t, s, n, k in zip(tables[:3], seqs, lengths, ks)]
    step2.append(SeqForward(tables[3], seqs[3], 0, ks[3] + 1))
    for f in step2:
        kv.reserve(f.table, f.start_pos + len(f.input_ids))
    out = runner.forward(step2)

    with torch.no_grad():
        for s, k, (logits, hidden) in zip(seqs, ks, out):
            ref = plain(torch.tensor([s])).logits[0, -(k + 1):]
            assert logits.shape == ref.shape
            torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
            assert hidden.shape == (k + 1, config.hidden_size)


def test_block_accounting_reserve_truncate_release():
    spec = KVCacheSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32,
                       block_size=4, num_blocks=5)
    kv = PagedKVCache(spec, torch.device("cpu"))
    a, b = BlockTable(), BlockTable()
    kv.reserve(a, 7)  # 2 blocks
    kv.reserve(a, 9)  # crosses into a third block
    assert len(a) == 3 and kv.num_free_blocks == 2
    assert not kv.can_reserve(b, 9)
    with pytest.raises(OutOfBlocks):
        kv.reserve(b, 9)
    assert kv.num_free_blocks == 2 and len(b) == 0  # a failed reserve allocates nothing
    kv.truncate(a, 5)  # rejected drafts: the third block is empty again
    assert len(a) == 2 and kv.num_free_blocks == 3
    slots = kv.slots(a, 3, 6).tolist()
    assert slots == [a.blocks[0] * 4 + 3, a.blocks[1] * 4, a.blocks[1] * 4 + 1]
    kv.release(a)
    assert kv.num_free_blocks == 5
