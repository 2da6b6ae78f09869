"""Golden test: the paged, packed ragged-batch forward gives the same logits as the plain
transformers forward of each sequence alone, for Llama, Mistral and Qwen2."""

from __future__ import annotations

import pytest
import torch
from paged_testlib import SMALL, plain_and_paged
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from kernels.layout import StepLayout
from verifier_service.kv.cache import BlockTable, KVCacheSpec, OutOfBlocks, PagedKVCache
from verifier_service.model.runner import ModelRunner


@pytest.mark.parametrize("cls, config", [
    (LlamaForCausalLM, LlamaConfig(**SMALL)),
    (MistralForCausalLM, MistralConfig(**SMALL, sliding_window=12)),
    (Qwen2ForCausalLM, Qwen2Config(**SMALL)),
], ids=["llama", "mistral-sliding-window", "qwen2"])
def test_paged_ragged_logits_equal_plain_forward(tmp_path, cls, config):
    plain, paged = plain_and_paged(tmp_path, cls, config)
    kv = PagedKVCache(KVCacheSpec.for_model(paged.config, torch.float32, block_size=4,
                                            memory_bytes=0, num_blocks=64), torch.device("cpu"))
    runner = ModelRunner(paged, torch.device("cpu"), kv)
    g = torch.Generator().manual_seed(1)
    lengths, ks = [5, 17, 31, 9], [0, 3, 6, 1]
    seqs = [torch.randint(0, config.vocab_size, (n + k,), generator=g).tolist()
            for n, k in zip(lengths, ks)]
    tables = [BlockTable() for _ in seqs]

    # Step 1: prefill all but the last 2 tokens of the first three; the fourth is not there yet.
    # (a prefill chunk: it emits nothing, so no logits rows)
    inputs1 = [s[:n - 2] for s, n in zip(seqs, lengths)][:3]
    for t, ids in zip(tables, inputs1):
        kv.reserve(t, len(ids))
    layout1 = StepLayout.build([len(i) for i in inputs1], [0, 0, 0], [0, 0, 0], [False] * 3)
    logits1, _ = runner.forward([t for i in inputs1 for t in i], tables[:3], layout1)
    assert logits1.shape == (0, config.vocab_size)

    # Step 2, ragged: 2 uncached tokens + k drafts each, and a brand-new sequence's prefill.
    inputs2 = [s[n - 2:] for s, n in zip(seqs[:3], lengths)] + [seqs[3]]
    starts = [n - 2 for n in lengths[:3]] + [0]
    for t, ids, st in zip(tables, inputs2, starts):
        kv.reserve(t, st + len(ids))
    layout2 = StepLayout.build([len(i) for i in inputs2], starts, ks, [True] * 4)
    logits2, hidden2 = runner.forward([t for i in inputs2 for t in i], tables, layout2)
    rows = [k + 1 for k in ks]
    out = list(zip(logits2.split(rows), hidden2.split(rows)))

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


def _one_forward(runner, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    table = BlockTable()
    runner.kv.reserve(table, len(ids))
    layout = StepLayout.build([len(ids)], [0], [len(ids) - 1], [True])
    return runner.forward(ids, [table], layout)


@pytest.mark.parametrize("linear", ["onednn", "fp16", "fp16-dot"])
def test_a_packed_runner_lets_go_of_the_layers_float32_weights_and_computes_the_same(
        tmp_path, monkeypatch, linear):
    """The packed products keep their own copies, so the layers' float32 weights go (the
    model's projections to the meta device) and every logit stays the same bits; the
    embedding and the head stay."""
    import splitspec.lean_llama as lean_llama
    from kernels.linear import available

    if not available(linear):
        pytest.skip(f"no {linear} kernel on this CPU")
    _, model = plain_and_paged(tmp_path, LlamaForCausalLM, LlamaConfig(**SMALL))
    with torch.no_grad():  # fp16-exact values: both packed kernels take them
        for p in model.parameters():
            p.copy_(p.half().float())
    _, kept_model = plain_and_paged(tmp_path / "kept", LlamaForCausalLM, LlamaConfig(**SMALL))
    kept_model.load_state_dict(model.state_dict())

    def runner(m):
        kv = PagedKVCache(KVCacheSpec.for_model(m.config, torch.float32, block_size=4,
                                                memory_bytes=0, num_blocks=16),
                          torch.device("cpu"))
        return ModelRunner(m, torch.device("cpu"), kv, linear=linear)

    released = runner(model)
    with monkeypatch.context() as patch:
        patch.setattr(lean_llama.LeanDecoder, "release_dense", lambda self, m: None)
        kept = runner(kept_model)
    ids = torch.randint(0, SMALL["vocab_size"], (12,), generator=torch.Generator().manual_seed(2))
    got, want = _one_forward(released, ids.tolist()), _one_forward(kept, ids.tolist())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    attn = model.get_decoder().layers[0].self_attn
    assert attn.q_proj.weight.device.type == "meta"
    layer = released._lean.layers[0]  # norm, qkv, o, norm, gate_up, down
    assert all(layer[i].weight.device.type == "meta" for i in (1, 2, 4, 5))
    assert released._lean.embed.device.type == "cpu" and released.vocab_size == SMALL["vocab_size"]
    assert kept_model.get_decoder().layers[0].self_attn.q_proj.weight.device.type == "cpu"
