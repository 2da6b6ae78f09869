"""Runs the target model over a packed ragged batch on the paged KV cache.

Each sequence contributes its uncached tokens plus its draft tokens (prefill, decode and
verification are the same operation); one forward covers the whole batch. Logits are computed
only for the rows that are verified: the last k+1 of each sequence.
"""

from __future__ import annotations

import torch

from kernels.layout import StepLayout
from verifier_service.kv_cache import BlockTable, PagedKVCache
from verifier_service.paged_attention import ATTENTION_NAME, PagedBatch


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
    def forward(self, input_ids: list[int], tables: list[BlockTable], layout: StepLayout
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over the packed step: input_ids [T_in] laid out as `layout` says, each
        sequence's table already holding slots for start_pos + query_len positions.
        Returns float32 logits [T_out, V] at layout.logits_indices, and the final hidden states
        [T_out, H] they came from (after the final norm: what hidden-state proposers read)."""
        ids = torch.tensor(input_ids, device=self.device)  # [T_in]
        starts, lens = layout.start_pos.tolist(), layout.query_lens.tolist()
        slot_mapping = torch.cat([self.kv.slots(t, s, s + n)
                                  for t, s, n in zip(tables, starts, lens)])
        context = [self.kv.slots(t, 0, s + n) for t, s, n in zip(tables, starts, lens)]
        batch = PagedBatch.build(self.kv.k, self.kv.v, slot_mapping, context, lens, self.device)
        res = self._decoder(input_ids=ids[None],
                            position_ids=layout.positions().to(self.device)[None],
                            use_cache=False, paged=batch)
        hidden = res.last_hidden_state[0][layout.logits_indices.to(self.device)]  # [T_out, H]
        return self._head(hidden).float(), hidden
