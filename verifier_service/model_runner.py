"""Runs the target model over a packed ragged batch on the paged KV cache.

Each sequence contributes its uncached tokens plus its draft tokens (prefill, decode and
verification are the same operation); one forward covers the whole batch. Logits are computed
only for the rows that are verified: the last k+1 of each sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verifier_service.kv_cache import BlockTable, PagedKVCache
from verifier_service.paged_attention import ATTENTION_NAME, PagedBatch


@dataclass
class SeqForward:
    table: BlockTable  # must already hold slots for start_pos + len(input_ids) positions
    input_ids: list[int]  # tokens not in the cache yet, then the draft tokens
    start_pos: int  # position of input_ids[0] (= tokens already in the cache)
    num_logits: int  # rows wanted from the end: k drafts + 1


class ModelRunner:
    def __init__(self, model, device: torch.device, kv: PagedKVCache):
        if model.config._attn_implementation != ATTENTION_NAME:
            raise ValueError(f"load the model with attn_implementation={ATTENTION_NAME!r}")
        self.model = model
        self.device = device
        self.kv = kv
        self.config = model.config
        # Decoder and LM head separately: logits only for the verified rows, and the final
        # hidden state for proposers that condition on it. (Llama-family heads: no logit
        # soft-capping or scaling after the head.)
        self._decoder = model.get_decoder()
        self._head = model.get_output_embeddings()
        self.vocab_size = self._head.weight.shape[0]
        self.hidden_size = model.config.hidden_size

    @torch.inference_mode()
    def forward(self, seqs: list[SeqForward]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per sequence: float32 logits [num_logits, vocab] for its last positions, and the
        final hidden states [num_logits, hidden] they came from (the MLP speculator's input)."""
        lens = [len(s.input_ids) for s in seqs]
        ids = torch.tensor([t for s in seqs for t in s.input_ids], device=self.device)  # [T]
        pos = torch.cat([torch.arange(s.start_pos, s.start_pos + n) for s, n in zip(seqs, lens)])
        slot_mapping = torch.cat([self.kv.slots(s.table, s.start_pos, s.start_pos + n)
                                  for s, n in zip(seqs, lens)])
        context = [self.kv.slots(s.table, 0, s.start_pos + n) for s, n in zip(seqs, lens)]
        batch = PagedBatch.build(self.kv.k, self.kv.v, slot_mapping, context, lens, self.device)
        res = self._decoder(input_ids=ids[None], position_ids=pos.to(self.device)[None],
                            use_cache=False, paged=batch)
        hidden = res.last_hidden_state[0]  # [T, H], after the final norm
        ends = torch.tensor(lens).cumsum(0)
        rows = torch.cat([torch.arange(e - s.num_logits, e) for s, e in zip(seqs, ends.tolist())])
        h = hidden[rows.to(self.device)]  # [sum(num_logits), H]
        logits = self._head(h).float()
        sizes = [s.num_logits for s in seqs]
        return list(zip(logits.split(sizes), h.split(sizes)))
