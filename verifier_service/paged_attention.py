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

from kernels.layout import StepLayout

ATTENTION_NAME = "splitspec_paged"


@dataclass
class PagedBatch:
    """Per-step addressing shared by all layers. Index tensors live on the model's device.

    Who sees whom comes from the step's layout (kernels/layout.py): a sequence's fed row j sits
    in cache column start + j and sees the columns before start (its cached tokens) and the
    columns of its ancestors and itself; for chains that is the causal mask, built here by
    arithmetic, for trees the layout's ancestor relation is placed over the fed columns."""

    k_cache: torch.Tensor  # [layers, slots, kv_heads, head_dim]
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [T]: where each packed token's K/V goes
    context_slots: torch.Tensor  # [B, max_ctx]: slots of each sequence's columns 0..ctx-1
    query_col: torch.Tensor  # [B, max_q, 1]: cache column of each padded query (start + j)
    context_len: torch.Tensor  # [B, 1, 1]
    query_index: torch.Tensor  # [B, max_q]: packed row of each padded query (T for padding)
    packed_index: torch.Tensor  # [T]: flat index into [B * max_q] of each packed token
    # (first, end) when the batch is one sequence whose slots are consecutive (its blocks were
    # handed out in a row): its context is then a view of the cache, no gather
    context_range: tuple[int, int] | None = None
    # trees only (None for chains): the layout's ancestor relation [B, max_q, max_q], each
    # sequence's first fed column [B, 1, 1], and the positions of queries [B, max_q, 1] and of
    # every context column [B, 1, max_ctx] (for sliding windows, which count positions)
    ancestors: torch.Tensor | None = None
    start: torch.Tensor | None = None
    query_pos: torch.Tensor | None = None
    key_pos: torch.Tensor | None = None
    _masks: dict = field(default_factory=dict)  # sliding window (or None) -> mask

    def mask(self, sliding_window: int | None) -> torch.Tensor:
        """[B, 1, max_q, max_ctx] bool: cached tokens + ancestors + itself, within the context,
        within the window. Built once per step and window, shared by every layer."""
        if sliding_window not in self._masks:
            k_col = torch.arange(self.context_slots.shape[1], device=self.query_col.device)
            if self.ancestors is None:  # chains: causal, column = position
                m = (k_col <= self.query_col) & (k_col < self.context_len)
                if sliding_window:
                    m &= k_col > self.query_col - sliding_window
            else:
                m = self._tree_mask(k_col)
                if sliding_window:
                    m &= self.key_pos > self.query_pos - sliding_window
            m[:, :, 0] |= ~m.any(-1)  # padding queries attend something; their rows are dropped
            self._masks[sliding_window] = m[:, None]
        return self._masks[sliding_window]

    def _tree_mask(self, k_col: torch.Tensor) -> torch.Tensor:
        """[B, max_q, max_ctx]: the cached columns, then the ancestor relation over the fed ones."""
        b, max_q, _ = self.ancestors.shape
        n_ctx = k_col.numel()
        cached = (k_col < self.start).expand(b, max_q, n_ctx)  # [B, max_q, max_ctx]
        # fed row a of sequence i sits at column start_i + a; a wider buffer takes the columns
        # that padding pushes past max_ctx, so every scatter index is distinct
        wide = torch.cat([cached, cached.new_zeros(b, max_q, max_q)], dim=2)
        cols = (self.start + torch.arange(max_q, device=k_col.device)).expand(b, max_q, max_q)
        wide.scatter_(2, cols, self.ancestors)
        return wide[:, :, :n_ctx]

    @classmethod
    def build(cls, k_cache, v_cache, slot_mapping: torch.Tensor, context_slots: list[torch.Tensor],
              layout: StepLayout, device: torch.device) -> "PagedBatch":
        """context_slots: per sequence, the slots of its columns 0..start + query_len - 1."""
        query_lens = layout.query_lens.tolist()
        b = len(query_lens)
        max_q = layout.max_query_len
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
        ctx_len = torch.tensor(ctx_lens)[:, None, None]  # [B, 1, 1]
        first = layout.start_pos[:, None, None]  # [B, 1, 1]
        q_col = first + torch.arange(max_q)[None, :, None]  # [B, max_q, 1]
        span = None
        if b == 1 and max_ctx > 0:
            c = context_slots[0]
            lo = int(c[0])
            if int(c[-1]) - lo == max_ctx - 1 and bool((c.diff() == 1).all()):
                span = (lo, lo + max_ctx)
        tree = {}
        if layout.ancestors is not None:
            seq = torch.repeat_interleave(torch.arange(b), layout.query_lens)  # [T]
            local = torch.arange(len(seq)) - torch.repeat_interleave(layout.query_start,
                                                                     layout.query_lens)
            q_pos = torch.zeros(b, max_q, dtype=torch.long)
            q_pos[seq, local] = layout.query_positions
            k_pos = torch.arange(max_ctx).repeat(b, 1)  # [B, max_ctx]: a cached column's position
            k_pos[seq, layout.start_pos[seq] + local] = layout.query_positions
            tree = dict(ancestors=layout.ancestors.to(device), start=first.to(device),
                        query_pos=q_pos[:, :, None].to(device), key_pos=k_pos[:, None].to(device))
        return cls(k_cache, v_cache, slot_mapping.to(device), ctx.to(device), q_col.to(device),
                   ctx_len.to(device), q_index.to(device), torch.cat(packed).to(device), span,
                   **tree)

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
