"""The model families the verifier serves: a tiny random checkpoint of each, served through the
real engine (paged KV cache, packed batch, with and without n-gram speculation), must produce at
every generated position a token that Hugging Face's own forward ranks first, teacher-forced over
the whole output.

Families marked unsupported fail today for the reason given; the marks are strict, so a change
that makes one work turns its entry red until it is moved to the supported list (and README.md's
list of families is updated).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from engine_testlib import make_engine, request_ids, run_all
from tiny_proposer_models import TINY_TARGET, copy_tokenizer
from transformers import AutoConfig, AutoModelForCausalLM

from splitspec.errors import BadModel

# Every family gets the tiny Llama fixture's tokenizer (vocabulary 1024).
BASE = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=256, bos_token_id=0, eos_token_id=0, pad_token_id=None,
            tie_word_embeddings=False)
MOE = dict(num_experts_per_tok=2)
WINDOW = dict(sliding_window=8)  # shorter than prompt + output: the window is exercised
DROP = object()  # an override that removes the key: the family's config has its own idea of it
FAMILIES = {  # model_type -> overrides of BASE
    "llama": {}, "mistral": WINDOW, "ministral": WINDOW, "qwen2": {}, "qwen3": {},
    "gemma": {}, "gemma2": WINDOW, "gemma3_text": WINDOW, "phi": dict(partial_rotary_factor=0.5),
    "phi3": {}, "granite": {}, "olmo": {}, "olmo2": {}, "olmo3": {}, "cohere": {},
    "cohere2": WINDOW, "starcoder2": WINDOW, "gpt2": dict(num_key_value_heads=4),
    "gpt_neox": dict(num_key_value_heads=4), "glm": {}, "glm4": {}, "helium": {},
    "smollm3": {}, "exaone4": {}, "seed_oss": {}, "arcee": {}, "ernie4_5": {},
    "mixtral": dict(MOE, num_local_experts=4), "granitemoe": dict(MOE, num_local_experts=4),
    "qwen2_moe": dict(MOE, num_experts=4, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64),
    "qwen3_moe": dict(MOE, num_experts=4, moe_intermediate_size=32),
    "olmoe": dict(MOE, num_experts=4),
}
UNSUPPORTED = {  # model_type -> (overrides, the error it fails with today, why)
    "stablelm": (dict(partial_rotary_factor=0.25), RuntimeError,
                 "its decoder layer does not pass the step's keyword arguments to attention, so "
                 "the paged batch never reaches the attention function"),
    "falcon": (dict(head_dim=DROP, num_key_value_heads=DROP, new_decoder_architecture=True,
                    num_kv_heads=2), BadModel,
               "its attention does not go through transformers' attention interface"),
    "deepseek_v3": (dict(head_dim=DROP, n_routed_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32, kv_lora_rank=16, q_lora_rank=32,
                         qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                         first_k_dense_replace=1, n_group=1, topk_group=1), RuntimeError,
                    "multi-head latent attention: keys and values per head differ in size from "
                    "the KV cache's num_key_value_heads x head_dim"),
}
PROMPT_LENGTHS, NEW_TOKENS = (7, 13), 10


def _tiny(model_type: str, overrides: dict, out) -> str:
    kwargs = {**BASE, **overrides}
    kwargs = {k: v for k, v in kwargs.items() if v is not DROP}
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kwargs)).save_pretrained(
        out)
    copy_tokenizer(TINY_TARGET, out)
    return str(out)


def _served_greedy_is_hf_argmax(model_dir: str) -> None:
    engine = make_engine(model_dir)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, BASE["vocab_size"], (n,), generator=g).tolist()
               for n in PROMPT_LENGTHS]
    plain = [request_ids(f"p{i}", p, NEW_TOKENS, ignore_eos=True) for i, p in enumerate(prompts)]
    spec = [request_ids(f"s{i}", p, NEW_TOKENS, k=3, ignore_eos=True)
            for i, p in enumerate(prompts)]
    outs = asyncio.run(run_all(engine, plain + spec))  # one batch: plain and speculated together
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    for (tokens, _, _), prompt in zip(outs, prompts + prompts):
        assert len(tokens) == NEW_TOKENS
        with torch.inference_mode():
            logits = hf(torch.tensor([prompt + tokens])).logits[0]  # [T, V]
        rows = logits[len(prompt) - 1:-1]  # [NEW_TOKENS, V]: the rows that chose each token
        chosen = rows.gather(1, torch.tensor(tokens)[:, None])[:, 0]
        # the served token is HF's argmax (up to float noise between near-tied logits)
        gap = rows.max(-1).values - chosen
        assert (gap <= 1e-4).all(), f"served tokens {tokens} not HF's argmax (gaps {gap})"


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_family_serves_hf_greedy(model_type, tmp_path):
    _served_greedy_is_hf_argmax(_tiny(model_type, FAMILIES[model_type], tmp_path))


@pytest.mark.parametrize("model_type", [
    pytest.param(t, marks=pytest.mark.xfail(strict=True, raises=error, reason=why))
    for t, (_, error, why) in UNSUPPORTED.items()])
def test_unsupported_family(model_type, tmp_path):
    _served_greedy_is_hf_argmax(_tiny(model_type, UNSUPPORTED[model_type][0], tmp_path))
