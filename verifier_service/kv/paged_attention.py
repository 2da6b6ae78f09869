"""Attention over the paged KV cache for a packed, ragged batch, plugged into transformers.

The model runs on a batch packed into one row: input_ids [1, T], T = the tokens of all sequences
of the step (uncached tokens + drafts), each at its own positions. transformers' attention modules
apply RoPE and then call the function registered here under ATTENTION_NAME, with the step's
`PagedBatch` passed through the model's **kwargs. The function writes the new keys/values into
their slots, gathers each sequence's context from its blocks, and runs one masked SDPA over the
batch padded to [B, heads, max_query, max_context]. A step that feeds a few rows per sequence
(decode, drafts) reads the contexts in place instead: a lone sequence whose blocks are one run
of consecutive slots as one view of the cache, else each sequence run by run when its blocks
form a few runs (a cached prefix's blocks, then its own; kernels/run_attention.py), each run's
keys and values a view.

Any model whose attention calls the attention interface this way runs on this path; tested:
Llama, Mistral, Qwen2. Since no mask function is registered under ATTENTION_NAME, transformers
builds no mask: causality, context lengths and sliding windows are applied here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

import torch
import torch.nn.functional as F

from kernels.paged_attention import context_slots, paged_attention
from kernels.run_attention import attention_over_runs, slot_runs

ATTENTION_NAME = "splitspec_paged"
# a step that feeds at most MAX_RUN_ROWS rows per sequence attends per sequence, reading a
# context that lies in at most MAX_RUNS runs of slots in place and gathering one in more: past
# those, per-run products and masks cost more than the gather (measured on the CPU at a
# 1,500-token context; bench/reports/2026-history-performance.md)
MAX_RUNS = 4
MAX_RUN_ROWS = 8


@dataclass
class PagedBatch:
    """Per-step addressing shared by all layers, built on the device from the step plan's arrays
    (verifier_service/step/plan.py): nothing here is read back to the host.

    Who sees whom comes from the step's layout (kernels/layout.py): a sequence's fed row j sits
    in cache column start + j and sees the columns before start (its cached tokens) and the
    columns of its ancestors and itself; for chains that is the causal mask, built here by
    arithmetic, for trees the layout's ancestor relation is placed over the fed columns.
    A bucket step (uniform rows, padding included) runs kernels.paged_attention instead: block
    tables and tree bits read by one kernel (Triton on accelerators), no context gathered."""

    k_cache: torch.Tensor  # [layers, slots, kv_heads, head_dim]
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [T]: where each packed token's K/V goes
    block_tables: torch.Tensor  # [B, NB]
    block_size: int
    start: torch.Tensor  # [B]: cached tokens (the column of fed row 0)
    context_lens: torch.Tensor  # [B]: columns each sequence reads
    query_index: torch.Tensor  # [B, max_q]: packed row of each padded query (T for padding)
    packed_index: torch.Tensor  # [T]: flat index into [B * max_q] of each packed token
    first_node: torch.Tensor  # [B], node_bits [T]: the draft trees (kernels/paged_attention.py)
    node_bits: torch.Tensor
    positions: torch.Tensor  # [T]: each fed row's position (a tree node: its depth)
    max_ctx: int = 0  # columns gathered per sequence (exact steps: the longest context)
    uniform: bool = False  # a bucket step: kernels.paged_attention serves it
    kernel: str = "reference"  # kernels.paged_attention's impl for bucket steps
    # exact steps with trees: the layout's ancestor relation [B, max_q, max_q] (on the device)
    ancestors: torch.Tensor | None = None
    # (first, end) when the batch is one sequence whose slots are consecutive (its blocks were
    # handed out in a row): its context is then a view of the cache, no gather
    context_range: tuple[int, int] | None = None
    # per sequence, when the step feeds at most MAX_RUN_ROWS rows per sequence (on the CPU; a
    # lone sequence in one run has context_range instead): ((first slot, columns), ...), the
    # runs of consecutive slots its context lies in, each read as a view
    # (kernels/run_attention.py), or, past MAX_RUNS runs, its slots [context] to gather
    context_runs: tuple[tuple[tuple[int, int], ...] | torch.Tensor, ...] | None = None
    # with context_runs, host side: each sequence's cached tokens, first packed row and rows
    runs_start: tuple[int, ...] = ()
    runs_rows: tuple[tuple[int, int], ...] = ()
    _cache: dict = field(default_factory=dict)  # per-step tensors shared by every layer

    @classmethod
    def from_plan(cls, k_cache: torch.Tensor, v_cache: torch.Tensor, views: dict, plan,
                  block_size: int, kernel: str = "reference") -> "PagedBatch":
        """From a StepPlan's arrays already on the device (`views`)."""
        ancestors = None
        if plan.ancestors is not None:
            ancestors = plan.ancestors.to(views["start"].device, non_blocking=True)
        return cls(k_cache, v_cache, views["slots"], views["block_tables"], block_size,
                   views["start"], views["context_lens"], views["query_index"],
                   views["packed_index"], views["first_node"], views["node_bits"],
                   views["positions"], plan.max_context, uniform=plan.bucket is not None,
                   kernel=kernel,
                   ancestors=ancestors, context_range=plan.context_range,
                   **_runs(plan, block_size, views["start"].device))

    def _shared(self, name: str, make):
        if name not in self._cache:
            self._cache[name] = make()
        return self._cache[name]

    @property
    def max_q(self) -> int:
        return self.query_index.shape[1]

    @property
    def context_slots(self) -> torch.Tensor:
        """[B, NB * bs]: the slot of every column of each sequence, through its table."""
        return self._shared("slots", lambda: context_slots(self.block_tables,
                                                           self.block_size)[:, :self.max_ctx])

    def mask(self, sliding_window: int | None) -> torch.Tensor:
        """[B, 1, max_q, max_ctx] bool: cached tokens + ancestors + itself, within the context,
        within the window. Built once per step and window, shared by every layer."""
        return self._shared(("mask", sliding_window), lambda: self._mask(sliding_window))

    def _mask(self, sliding_window: int | None) -> torch.Tensor:
        max_ctx = self.max_ctx
        dev = self.start.device
        k_col = torch.arange(max_ctx, device=dev)
        q_col = (self.start[:, None] + torch.arange(self.max_q, device=dev))[:, :, None]
        ctx_len = self.context_lens[:, None, None]
        if self.ancestors is None:  # chains: causal, column = position
            m = (k_col <= q_col) & (k_col < ctx_len)
            if sliding_window:
                m &= k_col > q_col - sliding_window
        else:
            m = self._tree_mask(k_col) & (k_col < ctx_len)
            if sliding_window:
                q_pos, k_pos = self._tree_positions(max_ctx)
                m &= k_pos > q_pos - sliding_window
        m[:, :, 0] |= ~m.any(-1)  # padding queries attend something; their rows are dropped
        return m[:, None]

    def _tree_mask(self, k_col: torch.Tensor) -> torch.Tensor:
        """[B, max_q, max_ctx]: the cached columns, then the ancestor relation over the fed ones."""
        b, max_q, _ = self.ancestors.shape
        n_ctx = k_col.numel()
        start = self.start[:, None, None]
        cached = (k_col < start).expand(b, max_q, n_ctx)  # [B, max_q, max_ctx]
        # fed row a of sequence i sits at column start_i + a; a wider buffer takes the columns
        # that padding pushes past max_ctx, so every scatter index is distinct
        wide = torch.cat([cached, cached.new_zeros(b, max_q, max_q)], dim=2)
        cols = (start + torch.arange(max_q, device=k_col.device)).expand(b, max_q, max_q)
        wide.scatter_(2, cols, self.ancestors)
        return wide[:, :, :n_ctx]

    def _tree_positions(self, max_ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions of the queries [B, max_q, 1] and of every context column [B, 1, max_ctx]
        (a cached column's position is its column; a fed one's, its row's): sliding windows
        count positions, and a tree node's position is its depth."""
        b, max_q = self.query_index.shape
        dev = self.start.device
        q_pos = torch.zeros(b * max_q, dtype=torch.int64, device=dev)
        q_pos.index_copy_(0, self.packed_index, self.positions)
        seq, local = self.packed_index // max_q, self.packed_index % max_q
        k_pos = torch.arange(max_ctx, device=dev).repeat(b, 1)  # [B, max_ctx]
        k_pos.view(-1).index_copy_(0, seq * max_ctx + self.start[seq] + local, self.positions)
        return q_pos.view(b, max_q, 1), k_pos[:, None]

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
    k_cache.index_copy_(0, paged.slot_mapping, _as(key[0].transpose(0, 1), k_cache.dtype))
    v_cache.index_copy_(0, paged.slot_mapping, _as(value[0].transpose(0, 1), v_cache.dtype))

    b, max_q = paged.query_index.shape
    hq, d = query.shape[1], query.shape[3]
    if paged.uniform:  # a bucket: the tables and tree bits read by one kernel
        if kwargs.get("sliding_window"):
            raise RuntimeError("bucket steps serve models without sliding windows")
        out = paged_attention(query[0].transpose(0, 1), k_cache, v_cache, paged.block_tables,
                              paged.block_size, paged.start, paged.context_lens,
                              paged.packed_index, max_q, paged.first_node, paged.node_bits,
                              scaling if scaling is not None else d ** -0.5, paged.kernel)
        return out[None], None  # [1, T, Hq, D]
    if paged.context_runs is not None:  # a few rows per sequence over a few runs: no gather
        return _over_runs(paged, query[0], k_cache, v_cache, scaling, kwargs), None
    if b == 1:  # one sequence: the packed rows are its queries already, no padding to undo
        k = _as(paged.context(k_cache).transpose(1, 2), query.dtype)  # [1, Hkv, ctx, D]
        v = _as(paged.context(v_cache).transpose(1, 2), query.dtype)
        window = kwargs.get("sliding_window")
        # a single query (decode) sees its whole context unless a window cuts it
        mask = None if max_q == 1 and not window else paged.mask(window)
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scaling,
                                             enable_gqa=k.shape[1] != hq)
        return out.transpose(1, 2), None  # [1, T, Hq, D]
    q_packed = torch.cat([query[0].transpose(0, 1), query.new_zeros(1, hq, d)])  # [T+1, Hq, D]
    q = q_packed.index_select(0, paged.query_index.reshape(-1)).view(b, max_q, hq, d)
    q = q.transpose(1, 2)  # [B, Hq, max_q, D]
    k = _as(paged.context(k_cache).transpose(1, 2), query.dtype)  # [B, Hkv, max_ctx, D]
    v = _as(paged.context(v_cache).transpose(1, 2), query.dtype)
    mask = paged.mask(kwargs.get("sliding_window"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                         scale=scaling, enable_gqa=k.shape[1] != hq)
    out = out.transpose(1, 2).reshape(b * max_q, hq, d).index_select(0, paged.packed_index)
    return out[None], None  # [1, T, Hq, D], as transformers' attention functions return


def _over_runs(paged: PagedBatch, query: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, scaling, kwargs) -> torch.Tensor:
    """Each sequence's rows of query [Hq, T, D] over its runs, packed: [1, T, Hq, D]."""
    window = kwargs.get("sliding_window")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    mask = None if paged.max_q == 1 and not window else paged.mask(window)  # [B, 1, R, ctx]
    outs = []
    for i, (runs, start, (first, n)) in enumerate(zip(paged.context_runs, paged.runs_start,
                                                      paged.runs_rows)):
        seen = None if mask is None else mask[i, 0, :n, :start + n]
        keys, values = k_cache, v_cache
        if isinstance(runs, torch.Tensor):  # too many runs: its context gathered, one run
            keys, values = k_cache.index_select(0, runs), v_cache.index_select(0, runs)
            runs = ((0, len(runs)),)
        outs.append(attention_over_runs(query[:, first:first + n], keys, values, runs,
                                        scale, seen, 0 if window else start))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, 1)  # [Hq, T, D]
    return out.transpose(0, 1)[None]


def _runs(plan, block_size: int, device: torch.device) -> dict:
    """context_runs, runs_start and runs_rows for an exact step on the CPU that feeds at most
    MAX_RUN_ROWS rows per sequence (but a lone sequence in one run: context_range's view),
    read from the plan's host arrays; {} otherwise. Accelerators keep the batched gather: a
    few launches per step, not a few per sequence and layer."""
    sizes = dict(plan.fields.sizes)
    b = sizes["B"]
    if (device.type != "cpu" or plan.bucket is not None
            or (b == 1 and plan.context_range is not None) or sizes["R"] > MAX_RUN_ROWS):
        return {}
    a = plan.fields.arrays(plan.host.numpy())
    starts = a["start"][:b].tolist()
    lens = a["context_lens"][:b].tolist()
    every = []
    for i in range(b):
        runs = slot_runs(a["block_tables"][i], lens[i], block_size)
        if len(runs) > MAX_RUNS:  # fragmented: gathered through its table
            table = torch.from_numpy(a["block_tables"][i:i + 1].copy())
            runs = context_slots(table, block_size)[0, :lens[i]]
        every.append(runs)
    rows = [n - s for n, s in zip(lens, starts)]
    firsts = [0, *accumulate(rows)][:b]  # an exact step packs each sequence's rows in order
    return {"context_runs": tuple(every), "runs_start": tuple(starts),
            "runs_rows": tuple(zip(firsts, rows))}


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in dtype; no call at all when it already is (each call costs a dispatch per layer)."""
    return t if t.dtype == dtype else t.to(dtype)


def register() -> None:
    """Make ATTENTION_NAME available to transformers models (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
