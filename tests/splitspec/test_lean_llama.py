"""The lean draft forward computes what the transformers forward computes: prefill, extension of
a cache, and a left-padded batch with a key mask."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from splitspec.lean_llama import LeanDecoder


@pytest.fixture(scope="module")
def model(tiny_target_dir):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()


@pytest.fixture(params=["dense", "auto"])
def linear(request):
    """The matmul kernels (kernels/linear.py): auto packs the test model's fp32 weights."""
    return request.param


@torch.inference_mode()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids])).logits[0]  # [S, V]


def test_supports_the_test_llama(model):
    assert LeanDecoder.supports(model)


def test_prefill_then_extend_matches_the_full_forward(model, linear):
    lean = LeanDecoder(model, linear)
    ids = torch.randint(3, model.config.vocab_size, (14,)).tolist()
    full = hf_logits(model, ids)
    logits, kv = lean.forward(torch.tensor([ids[:9]]), torch.arange(9)[None], None, None, 9)
    torch.testing.assert_close(logits[0], full[:9], atol=1e-4, rtol=1e-4)
    logits, kv = lean.forward(torch.tensor([ids[9:12]]), torch.arange(9, 12)[None], kv, None, 3)
    torch.testing.assert_close(logits[0], full[9:12], atol=1e-4, rtol=1e-4)
    logits, kv = lean.forward(torch.tensor([ids[12:13]]), torch.tensor([[12]]), kv, None, 1)
    torch.testing.assert_close(logits[0], full[12:13], atol=1e-4, rtol=1e-4)
    assert kv[0][0].shape[2] == 13


def test_a_left_padded_batch_with_a_key_mask_matches_each_row_alone(model, linear):
    lean = LeanDecoder(model, linear)
    a = torch.randint(3, model.config.vocab_size, (7,)).tolist()
    b = torch.randint(3, model.config.vocab_size, (4,)).tolist()
    _, kva = lean.forward(torch.tensor([a[:6]]), torch.arange(6)[None], None, None, 1)
    _, kvb = lean.forward(torch.tensor([b[:3]]), torch.arange(3)[None], None, None, 1)
    # rows right-aligned at 6 cached columns; b's first 3 columns are zero padding
    kv = []
    for (ka, va), (kb, vb) in zip(kva, kvb):
        pad = torch.zeros_like(ka[:, :, :3])
        kv.append((torch.cat([ka, torch.cat([pad, kb], 2)]), torch.cat([va, torch.cat([pad, vb],
                                                                                    2)])))
    key_mask = torch.ones(2, 7, dtype=torch.bool)
    key_mask[1, :3] = False
    ids = torch.tensor([[a[6]], [b[3]]])
    pos = torch.tensor([[6], [3]])
    logits, _ = lean.forward(ids, pos, kv, key_mask, 1)
    torch.testing.assert_close(logits[0, 0], hf_logits(model, a)[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1, 0], hf_logits(model, b)[-1], atol=1e-4, rtol=1e-4)


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind tensors (views of one storage count once)."""
    seen = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def test_the_fused_projections_share_the_models_memory(tiny_target_dir):
    """Fusing q/k/v and gate/up must not hold a second copy of the weights: the model's own
    projections become views of the fused matrices (on an accelerator, where the dense path
    runs, a copy would take the KV cache's memory). Its forward is unchanged."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    ids = torch.randint(3, model.config.vocab_size, (9,)).tolist()
    before_logits = hf_logits(model, ids)
    before = _storage_bytes(model.parameters())
    lean = LeanDecoder(model, "dense")
    fused = [lin.weight for layer in lean.layers for lin in layer[1:] if hasattr(lin, "weight")]
    assert _storage_bytes([*model.parameters(), *fused, lean.head.weight]) == before
    torch.testing.assert_close(hf_logits(model, ids), before_logits, atol=0, rtol=0)
    logits, _ = lean.forward(torch.tensor([ids]), torch.arange(9)[None], None, None, 9)
    torch.testing.assert_close(logits[0], before_logits, atol=1e-4, rtol=1e-4)


ROPES = {"llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
         "linear": {"rope_type": "linear", "factor": 4.0},
         "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}


def scaled_rope_model(kind: str):
    """A tiny random Llama (normal init) with a scaled RoPE: Llama 3.1's llama3 and others whose
    frequencies are fixed at load time."""
    from transformers import LlamaConfig

    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      rope_theta=10000.0, rope_scaling=ROPES[kind])
    return AutoModelForCausalLM.from_config(cfg).float().eval()


def check_scaled_rope(kind: str) -> None:
    model = scaled_rope_model(kind)
    assert LeanDecoder.supports(model)
    lean = LeanDecoder(model, "dense")
    ids = torch.randint(3, 128, (1, 12))
    pos = torch.arange(300, 312)[None]  # far past the original context: the scaling matters
    with torch.inference_mode():
        want = model(input_ids=ids, position_ids=pos).logits[0]
    got, _ = lean.forward(ids, pos, None, None, 12)
    torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", sorted(ROPES))
def test_a_scaled_rope_fixed_at_load_matches_the_transformers_forward(kind):
    check_scaled_rope(kind)


def test_the_check_catches_a_lean_forward_that_drops_the_rope_scaling(monkeypatch):
    import planted_bugs as bug

    bug.lean_rope_unscaled(monkeypatch)
    with pytest.raises(AssertionError):
        check_scaled_rope("llama3")
