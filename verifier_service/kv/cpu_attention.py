"""A CPU step's attention from the qkv product's rows: RoPE, the cache write and attention in
two calls per layer (kernels/cpu_step.py), for the lean forward of Llama-family models.

Built once per exact step from the plan's host arrays and shared by every layer: each
sequence's rows, cached columns and the runs of consecutive slots its context lies in (read in
place, however many runs), and, in a step with trees, the layout's ancestor relation. A
sequence feeding at most MAX_ROWS rows (a decode, a verification, a short prefill chunk) is
attended by the kernel, row by row, so its rows get the same numbers in any batch; one feeding
more (a prefill) goes through torch's SDPA over its context, where a GEMM-shaped product pays.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch
import torch.nn.functional as F

from kernels import cpu_step
from kernels.run_attention import slot_runs

__all__ = ["CpuAttention", "MAX_ROWS"]

MAX_ROWS = 16  # rows per sequence the kernel attends; more: a GEMM-shaped SDPA


@dataclass
class _Long:
    """A sequence attended by SDPA: its packed rows, its context's slots, and who sees whom."""

    first: int
    rows: int
    context: torch.Tensor | slice  # slots [ctx] (index_select) or one run (a view)
    mask: torch.Tensor  # [rows, ctx] bool


@dataclass
class CpuAttention:
    positions: torch.Tensor  # [T] int64 (the plan's views: drafts written on the device count)
    slots: torch.Tensor  # [T] int64
    seqs: torch.Tensor  # [S, 6] int64: the kernel's sequences (kernels/cpu_step.attend)
    runs: torch.Tensor  # [*, 2] int64
    ancestors: torch.Tensor  # uint8, flat
    max_ctx: int
    long: tuple[_Long, ...]

    @classmethod
    def for_plan(cls, plan, views: dict, block_size: int, k_cache: torch.Tensor
                 ) -> "CpuAttention | None":
        """For an exact step on the CPU with float32 caches where the kernels load; else None."""
        if (plan.bucket is not None or k_cache.device.type != "cpu"
                or k_cache.dtype != torch.float32 or not cpu_step.available(k_cache)):
            return None
        sizes = dict(plan.fields.sizes)
        b = sizes["B"]
        a = plan.fields.arrays(plan.host.numpy())
        starts = a["start"][:b].tolist()
        lens = a["context_lens"][:b].tolist()
        rows = [n - s for n, s in zip(lens, starts)]
        firsts = [0, *accumulate(rows)][:b]  # an exact step packs each sequence's rows in order
        anc = None if plan.ancestors is None else plan.ancestors.cpu().numpy()
        seqs, runs, flags, long = [], [], [], []
        flat = 0
        for i in range(b):
            blocks = a["block_tables"][i]
            if rows[i] > MAX_ROWS:
                long.append(_long(blocks, starts[i], rows[i], firsts[i], block_size,
                                  None if anc is None else anc[i, :rows[i], :rows[i]]))
                continue
            mine = slot_runs(blocks, lens[i], block_size)
            anc_off = -1
            if anc is not None:
                anc_off = flat
                flags.append(anc[i, :rows[i], :rows[i]].astype(np.uint8).ravel())
                flat += rows[i] * rows[i]
            seqs.append((firsts[i], rows[i], starts[i], len(runs), len(mine), anc_off))
            runs.extend(mine)
        return cls(views["positions"], views["slots"],
                   torch.tensor(seqs, dtype=torch.int64).view(-1, 6),
                   torch.tensor(runs, dtype=torch.int64).view(-1, 2),
                   torch.from_numpy(np.concatenate(flags) if flags else np.zeros(1, np.uint8)),
                   max((s[2] + s[1] for s in seqs), default=0), tuple(long))

    def __call__(self, qkv: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                 k_cache: torch.Tensor, v_cache: torch.Tensor, n_heads: int, n_kv: int,
                 scale: float) -> torch.Tensor:
        """qkv [T, (Hq + 2 Hkv) D] (the layer's product), rope: cos, signed sin [P, D]; one
        layer's caches [slots, Hkv, D]. Writes the rows' keys and values into their slots and
        returns the attention output [T, Hq * D]."""
        cos, sin = rope
        q = cpu_step.rope_write(qkv, self.positions, cos, sin, self.slots, k_cache, v_cache,
                                n_heads, n_kv)  # [T, Hq, D]
        t, d = q.shape[0], q.shape[2]
        out = q.new_empty(t, n_heads * d)
        if self.seqs.shape[0]:
            cpu_step.attend(q, k_cache, v_cache, scale, self.seqs, self.runs, self.ancestors,
                            self.max_ctx, out)
        for s in self.long:
            rows = q[s.first:s.first + s.rows].transpose(0, 1)  # [Hq, n, D]
            k, v = (c[s.context] if isinstance(s.context, slice) else c.index_select(0, s.context)
                    for c in (k_cache, v_cache))  # [ctx, Hkv, D]
            o = F.scaled_dot_product_attention(rows[None], k.permute(1, 0, 2)[None],
                                               v.permute(1, 0, 2)[None], attn_mask=s.mask,
                                               scale=scale, enable_gqa=n_heads != n_kv)
            out[s.first:s.first + s.rows] = o[0].transpose(0, 1).reshape(s.rows, -1)
        return out


def _long(blocks: np.ndarray, start: int, rows: int, first: int, block_size: int,
          ancestors: np.ndarray | None) -> _Long:
    ctx = start + rows
    runs = slot_runs(blocks, ctx, block_size)
    if len(runs) == 1:
        context = slice(runs[0][0], runs[0][0] + ctx)
    else:
        context = torch.cat([torch.arange(f, f + n) for f, n in runs])
    fed = (torch.from_numpy(np.ascontiguousarray(ancestors)).bool() if ancestors is not None
           else torch.ones(rows, rows, dtype=torch.bool).tril())
    mask = torch.cat([torch.ones(rows, start, dtype=torch.bool), fed], 1)
    return _Long(first, rows, context, mask)
