"""Runs the target model over a packed ragged batch on the paged KV cache.

Each sequence contributes its uncached tokens plus its draft tokens (prefill, decode and
verification are the same operation); one forward covers the whole batch. Logits are computed
only for the rows that are verified: the last k+1 of each sequence.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from kernels.layout import StepLayout
from kernels.linear import pack_linears
from splitspec.lean_llama import LeanDecoder
from verifier_service.kv_cache import BlockTable, PagedKVCache
from verifier_service.paged_attention import ATTENTION_NAME, PagedBatch, paged_attention_forward


class ModelRunner:
    def __init__(self, model, device: torch.device, kv: PagedKVCache, linear: str = "auto"):
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
        self.hidden_size = model.config.hidden_size
        # Llama-family models run as plain tensor ops (splitspec/lean_llama.py) with the same
        # paged attention function: the transformers forward's per-call machinery is ~10% of a
        # batch-1 step of a small model. Other architectures keep the transformers forward.
        # `linear` picks the matmul kernels (kernels/linear.py): packed once, batch invariant.
        self._lean = LeanDecoder(model, linear) if LeanDecoder.supports(model) else None
        if self._lean is not None:
            self._head, self.linear = self._lean.head, self._lean.linear
        else:
            self.linear = pack_linears(model, linear)
            self._head = model.get_output_embeddings()
        self.vocab_size = self._head.weight.shape[0]
        self._layer_refs = [SimpleNamespace(layer_idx=i)
                            for i in range(model.config.num_hidden_layers)]

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
        batch = PagedBatch.build(self.kv.k, self.kv.v, slot_mapping, context, layout, self.device)
        # positions and the mask both come from the layout (a tree's node sits at its depth)
        positions = layout.positions().to(self.device)[None]  # [1, T_in]
        if self._lean is not None:
            lean, refs = self._lean, self._layer_refs

            def attend(i, q, k, v):  # q [1, Hq, T, D], k/v [1, H_kv, T, D] -> [1, T, Hq * D]
                out, _ = paged_attention_forward(refs[i], q, k, v, None, lean.scale, paged=batch)
                return out.reshape(1, out.shape[1], -1)

            states = lean.hidden(ids[None], positions, attend)[0]  # [T_in, H]
        else:
            states = self._decoder(input_ids=ids[None], position_ids=positions, use_cache=False,
                                   paged=batch).last_hidden_state[0]
        hidden = states.index_select(0, layout.logits_indices.to(self.device))  # [T_out, H]
        return self._head(hidden).float(), hidden
