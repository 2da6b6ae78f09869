"""Runs the target model: one forward per sequence over its not-yet-cached tokens plus drafts.

The KV cache is transformers' DynamicCache, one per sequence, rolled back with `crop` after
rejected drafts. (This is the single-sequence path; the paged, ragged-batch path replaces it.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class ForwardWork:
    cache: DynamicCache
    input_ids: list[int]  # tokens not in the cache yet, then the draft tokens
    start_pos: int  # position of input_ids[0] (= tokens already in the cache)
    num_logits: int  # rows wanted from the end: k drafts + 1


class ModelRunner:
    def __init__(self, model, device: torch.device):
        self.model = model
        self.device = device
        self.config = model.config
        # Decoder and LM head separately: logits only for the rows that are verified, and the
        # final hidden state for proposers that condition on it. (Llama-family heads: no logit
        # soft-capping or scaling after the head.)
        self._decoder = model.get_decoder()
        self._head = model.get_output_embeddings()
        self.vocab_size = self._head.weight.shape[0]
        self.hidden_size = model.config.hidden_size

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    @torch.inference_mode()
    def forward(self, work: list[ForwardWork]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per work item: float32 logits [num_logits, vocab] for its last positions, and the
        final hidden states [num_logits, hidden] they came from (the MLP speculator's input)."""
        out = []
        for w in work:
            ids = torch.tensor([w.input_ids], dtype=torch.long, device=self.device)  # [1, S]
            pos = torch.arange(w.start_pos, w.start_pos + len(w.input_ids), device=self.device)
            res = self._decoder(input_ids=ids, position_ids=pos[None], past_key_values=w.cache,
                                use_cache=True)
            hidden = res.last_hidden_state[0, -w.num_logits:]  # [num_logits, H], after final norm
            out.append((self._head(hidden).float(), hidden))
        return out

    @staticmethod
    def rollback(cache: DynamicCache, length: int) -> None:
        """Drop cached positions >= length (rejected draft slots)."""
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)  # a negative count removes that many trailing positions
