"""A target model that follows a script, for tests that need the target to emit given tokens.

`make_scripted_target` writes a one-layer Llama with the tokenizer of a real model directory
(models/target: byte-level BPE) whose greedy next token after each token of a cyclic script is
the script's next token. Its attention and MLP outputs are zero, so the hidden state is the
token's embedding; the script's embeddings are orthogonal and each successor's LM-head row points
along its predecessor's embedding, so the argmax margin is large and exact.

With such a target a test decides what greedy decoding emits: multi-byte characters split over
tokens, an EOS or a stop token at a chosen position, and, with the prompt holding one cycle of
the script, an n-gram proposer that drafts exactly what the target will accept.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_proposer_models import copy_tokenizer

HIDDEN = 64
MARGIN = 10.0  # logit of the scripted successor / |hidden|; all other logits are ~0.01


def make_scripted_target(tokenizer_dir: str | Path, out: Path, script: list[int],
                         seed: int = 0) -> Path:
    from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

    if len(set(script)) != len(script) or len(script) > HIDDEN:
        raise ValueError("the script needs distinct tokens, at most HIDDEN of them")
    copy_tokenizer(tokenizer_dir, out)
    tc = AutoConfig.from_pretrained(tokenizer_dir, local_files_only=True)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=tc.vocab_size, hidden_size=HIDDEN, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=512, bos_token_id=tc.bos_token_id,
                         eos_token_id=tc.eos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        emb = torch.randn(tc.vocab_size, HIDDEN, generator=gen)
        q, _ = torch.linalg.qr(torch.randn(HIDDEN, len(script), generator=gen))  # [H, n]
        for i, tok in enumerate(script):
            emb[tok] = q[:, i] * HIDDEN ** 0.5  # RMS 1: the final norm leaves it as is
        head = torch.randn(tc.vocab_size, HIDDEN, generator=gen) * 0.01
        for i, _ in enumerate(script):
            head[script[(i + 1) % len(script)]] += MARGIN * q[:, i]
        model.model.embed_tokens.weight.copy_(emb)
        model.lm_head.weight.copy_(head)
    model.save_pretrained(out, safe_serialization=True)
    return out


def scripted_continuation(script: list[int], after: int, n: int) -> list[int]:
    """The target's greedy output: n tokens following script[after], cyclically."""
    return [script[(after + 1 + i) % len(script)] for i in range(n)]
