"""Attention over the paged KV cache for a packed, ragged batch, plugged into transformers.

The model runs on a batch packed into one row: input_ids [1, T], T = the tokens of all sequences
of the step (uncached tokens + drafts), each at its own positions. transformers' attention modules
apply RoPE and then call the function registered here under ATTENTION_NAME, with the step's
`PagedBatch` passed through the model's **kwargs. The function writes the new keys/values into
their slots, gathers each sequence's context from its blocks, and runs one masked SDPA over the
batch padded to [B, heads, max_query, max_context].

Any model whose attention calls the attention interface this way runs on this path; tested:
Llama, Mistral, Qwen2. Since no mask function is registered under ATTENTION_NAME, transformers
builds no mask: causality, context lengths and sliding windows are applied here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

ATTENTION_NAME = "splitspec_paged"


@dataclass
class PagedBatch:
    """Per-step addressing shared by all layers. Index tensors live on the model's device."""

    k_cache: torch.Tensor  # [layers, slots, kv_heads, head_dim]
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [T]: where each packed token's K/V goes
    context_slots: torch.Tensor  # [B, max_ctx]: slots of each sequence's positions 0..ctx-1
    query_pos: torch.Tensor  # [B, max_q, 1]: absolute position of each padded query
    context_len: torch.Tensor  # [B, 1, 1]
    query_index: torch.Tensor  # [B, max_q]: packed row of each padded query (T for padding)
    packed_index: torch.Tensor  # [T]: flat index into [B * max_q] of each packed token
    # (first, end) when the batch is one sequence whose slots are consecutive (its blocks were
    # handed out in a row): its context is then a view of the cache, no gather
    context_range: tuple[int, int] | None = None
    _masks: dict = field(default_factory=dict)  # sliding window (or None) -> mask

    def mask(self, sliding_window: int | None) -> torch.Tensor:
        """[B, 1, max_q, max_ctx] bool: causal, within the context, within the window."""
        if sliding_window not in self._masks:
            k_pos = torch.arange(self.context_slots.shape[1], device=self.query_pos.device)
            m = (k_pos <= self.query_pos) & (k_pos < self.context_len)
            if sliding_window:
                m &= k_pos > self.query_pos - sliding_window
            m[:, :, 0] |= ~m.any(-1)  # padding queries attend something; their rows are dropped
            self._masks[sliding_window] = m[:, None]
        return self._masks[sliding_window]

    @classmethod
    def build(cls, k_cache, v_cache, slot_mapping: torch.Tensor, context_slots: list[torch.Tensor],
              query_lens: list[int], device: torch.device) -> "PagedBatch":
        b = len(query_lens)
        max_q = max(query_lens)
        ctx_lens = [len(c) for c in context_slots]
        max_ctx = max(ctx_lens)
        ctx = torch.zeros(b, max_ctx, dtype=torch.long)
        q_index = torch.full((b, max_q), sum(query_lens), dtype=torch.long)
        packed = []
        start = 0
        for i, (c, n) in enumerate(zip(context_slots, query_lens)):
            ctx[i, :len(c)] = c
            q_index[i, :n] = torch.arange(start, start + n)
            packed.append(torch.arange(n) + i * max_q)
            start += n
        # query j of sequence i sits at absolute position ctx_len - n + j
        ctx_len = torch.tensor(ctx_lens)[:, None, None]  # [B, 1, 1]
        n_q = torch.tensor(query_lens)[:, None, None]
        q_pos = ctx_len - n_q + torch.arange(max_q)[None, :, None]  # [B, max_q, 1]
        span = None
        if b == 1 and max_ctx > 0:
            c = context_slots[0]
            first = int(c[0])
            if int(c[-1]) - first == max_ctx - 1 and bool((c.diff() == 1).all()):
                span = (first, first + max_ctx)
        return cls(k_cache, v_cache, slot_mapping.to(device), ctx.to(device), q_pos.to(device),
                   ctx_len.to(device), q_index.to(device), torch.cat(packed).to(device), span)

    def context(self, cache: torch.Tensor) -> torch.Tensor:
        """Each sequence's cached keys or values: [B, max_ctx, H_kv, D] from cache [slots, ...]
        (a view when the slots are one range; index_select, several times faster on CPU than
        advanced indexing, otherwise)."""
        if self.context_range is not None:
            first, end = self.context_range
            return cache[first:end][None]
        b, n = self.context_slots.shape
        return cache.index_select(0, self.context_slots.reshape(-1)).view(b, n, *cache.shape[1:])


def paged_attention_forward(module, query, key, value, attention_mask, scaling=None,
                            dropout=0.0, paged: PagedBatch | None = None, **kwargs):
    # query: [1, Hq, T, D]; key/value: [1, Hkv, T, D] with RoPE applied
    if paged is None:
        raise RuntimeError(f"{ATTENTION_NAME} attention needs the step's PagedBatch")
    layer = module.layer_idx
    k_cache, v_cache = paged.k_cache[layer], paged.v_cache[layer]  # [slots, Hkv, D]
    k_cache.index_copy_(0, paged.slot_mapping, key[0].transpose(0, 1).to(k_cache.dtype))
    v_cache.index_copy_(0, paged.slot_mapping, value[0].transpose(0, 1).to(v_cache.dtype))

    b, max_q = paged.query_index.shape
    hq, d = query.shape[1], query.shape[3]
    if b == 1:  # one sequence: the packed rows are its queries already, no padding to undo
        k = paged.context(k_cache).transpose(1, 2).to(query.dtype)  # [1, Hkv, ctx, D]
        v = paged.context(v_cache).transpose(1, 2).to(query.dtype)
        window = kwargs.get("sliding_window")
        # a single query (decode) sees its whole context unless a window cuts it
        mask = None if max_q == 1 and not window else paged.mask(window)
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scaling,
                                             enable_gqa=k.shape[1] != hq)
        return out.transpose(1, 2), None  # [1, T, Hq, D]
    q_packed = torch.cat([query[0].transpose(0, 1), query.new_zeros(1, hq, d)])  # [T+1, Hq, D]
    q = q_packed.index_select(0, paged.query_index.reshape(-1)).view(b, max_q, hq, d)
    q = q.transpose(1, 2)  # [B, Hq, max_q, D]
    k = paged.context(k_cache).transpose(1, 2).to(query.dtype)  # [B, Hkv, max_ctx, D]
    v = paged.context(v_cache).transpose(1, 2).to(query.dtype)
    mask = paged.mask(kwargs.get("sliding_window"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                         scale=scaling, enable_gqa=k.shape[1] != hq)
    out = out.transpose(1, 2).reshape(b * max_q, hq, d).index_select(0, paged.packed_index)
    return out[None], None  # [1, T, Hq, D], as transformers' attention functions return


def register() -> None:
    """Make ATTENTION_NAME available to transformers models (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
