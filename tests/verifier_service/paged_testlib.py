"""Tiny random checkpoints loaded twice, plainly and on the paged attention path, for the tests
that hold the paged forward against the plain one (test_paged_runner.py, test_tree_forward.py)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from verifier_service.kv.paged_attention import ATTENTION_NAME, register

SMALL = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def plain_and_paged(tmp_path, cls, config):
    """The same weights loaded plainly (the reference) and on the paged path."""
    torch.manual_seed(0)
    cls(config).save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    register()
    paged = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                 attn_implementation=ATTENTION_NAME).eval()
    return plain, paged
