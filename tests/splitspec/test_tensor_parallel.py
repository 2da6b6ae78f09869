"""The sharded lean forward (splitspec/tensor_parallel.py) computes what the whole one computes:
each lean family (Llama, Mistral, Qwen2 with its q/k/v biases), tied and untied heads, split
over 2 and 4 ranks (threads of this process over a stand-in for the collectives,
tests/tp_testlib.py), a rank holding about 1/N of the weights; a split the model's heads do not
allow, or a model without the lean forward, is refused naming the flag. A shard whose
vocabulary rows are off by one (tests/planted_bugs.py) fails the check."""

from __future__ import annotations

import copy

import planted_bugs as bug
import pytest
import torch
from tp_testlib import ThreadRanks, tiny_family
from transformers import AutoConfig, AutoModelForCausalLM

from splitspec.lean_llama import LeanDecoder
from splitspec.tensor_parallel import check_shardable, shard_decoder, weight_bytes

CASES = {  # name -> (model_type, overrides)
    "llama": ("llama", {}),
    "llama-tied-4-kv-heads": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=True,
                                            vocab_size=1023)),  # V not a multiple of N
    "mistral": ("mistral", dict(sliding_window=None)),
    "qwen2": ("qwen2", {}),
}


@pytest.fixture(scope="module", params=list(CASES))
def model(request, tmp_path_factory):
    model_type, overrides = CASES[request.param]
    path = tiny_family(model_type, tmp_path_factory.mktemp(request.param), **overrides)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def sharded_logits(model, size: int, ids: torch.Tensor) -> tuple[list[torch.Tensor], list[int]]:
    """Every rank's logits of a causal forward over ids [B, S] (draft-style, SDPA), and every
    rank's weight bytes."""
    def rank(r, group):
        lean = LeanDecoder(copy.deepcopy(model), "dense")
        shard_decoder(lean, group, "dense")
        logits, _ = lean.forward(ids, torch.arange(ids.shape[1]).expand_as(ids), None, None,
                                 ids.shape[1])
        return logits, weight_bytes(lean)

    out = ThreadRanks(size).run(rank)
    return [o[0] for o in out], [o[1] for o in out]


def check_sharded_forward(model, size: int) -> None:
    kv = model.config.num_key_value_heads
    if kv % size:
        pytest.skip(f"{kv} KV heads do not split over {size}")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.config.vocab_size, (2, 11), generator=g)
    whole = LeanDecoder(model, "dense")
    ref, _ = whole.forward(ids, torch.arange(11).expand_as(ids), None, None, 11)
    logits, per_rank = sharded_logits(model, size, ids)
    for out in logits:  # every rank ends with the same whole logits
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert torch.equal(out, logits[0])
    # a rank holds its 1/N of every matrix, the norms (vectors) whole: at most 0.55x the bytes
    assert max(per_rank) <= (0.5 / size * 2 + 0.05) * weight_bytes(whole)


@pytest.mark.parametrize("size", [2, 4])
def test_the_sharded_forward_is_the_whole_forward(model, size):
    check_sharded_forward(model, size)


def test_the_check_catches_vocabulary_rows_off_by_one(model, monkeypatch):
    bug.tp_vocab_rows_off_by_one(monkeypatch)
    with pytest.raises(AssertionError):
        check_sharded_forward(model, 2)


def test_a_kv_head_count_the_size_does_not_divide_is_refused():
    config = AutoConfig.for_model("llama", num_attention_heads=8, num_key_value_heads=2)
    check_shardable(config, 2)
    with pytest.raises(ValueError, match="--tensor-parallel-size 4 does not divide the model's 2 "
                                         "key/value heads"):
        check_shardable(config, 4)


def test_a_model_without_the_lean_forward_is_refused():
    config = AutoConfig.for_model("gemma", num_attention_heads=4, num_key_value_heads=2)
    check_shardable(config, 1)  # one rank: nothing to shard, any family
    with pytest.raises(ValueError, match="'gemma' runs the transformers forward, which is not "
                                         "sharded"):
        check_shardable(config, 2)
    windowed = AutoConfig.for_model("mistral", sliding_window=8)
    with pytest.raises(ValueError, match="transformers forward"):
        check_shardable(windowed, 2)
