"""A step's drafts that are still on the device (methods/in_target.py DeviceDraft), fed to the
plan, the forward and the samplers from there, with no read back before the forward.

The host plans the step (verifier_service/step/plan.py) from what it knows before drafting:
every draft's node count k (a host int), so every row, slot, logits row and offset is placed
exactly; a device tree's shape stands in as a placeholder (every node on the root). What the
shape decides is then written over the plan's arrays on the device, after its one copy in
(StepPlan.device_ids, applied by the executor before the forward or the graph replay):

    ids, draft_ids   each draft's ids (clamped to the vocabulary)
    positions        each fed row's depth + start            kernels/tree_layout.py tree_rows
    node_bits        each node's ancestors-and-itself bits   kernels/tree_layout.py node_bits
    ancestors        the exact step's ancestor relation (StepPlan.ancestors, on the device)

For every sequence of the step at once, host trees and chains included (the device builds
what the host would: tests/verifier_service/test_device_drafts.py), so one construction serves
the step. SGLang's EAGLE worker builds its tree masks and positions on the device from the
selected candidates' parents the same way (build_tree_kernel_efficient); here as tensor ops.

The samplers get the same parts as tensors: the draft ids, the trees' parents with host bounds
(kernels/tree_rejection.py DeviceParents) and the q rows, after `q_guard` on the device.
"""

from __future__ import annotations

from typing import Sequence

import torch

from kernels.layout import PLACEHOLDER_TOKEN_ID, StepLayout
from kernels.sparse_probs import SparseProbs
from kernels.tree_layout import node_bits, tree_rows
from kernels.tree_rejection import DeviceParents
from splitspec.device import to_device
from splitspec.proposal import Draft
from verifier_service.methods.in_target import DeviceDraft

__all__ = ["draft_ids", "held", "place", "q_guard", "tree_parents", "unaccept"]

# a q row's sum may differ from 1 by this much (what the collector allows a proposer's)
Q_SUM_TOLERANCE = 1e-3


def held(drafts: Sequence[Draft | None]) -> list[int]:
    """The batch entries whose drafts are still on the device."""
    return [i for i, d in enumerate(drafts) if isinstance(d, DeviceDraft) and d.on_device]


def place(plan, layout: StepLayout, drafts: Sequence[Draft | None], ks: Sequence[int],
          held_at: Sequence[int], vocab_size: int, device: torch.device) -> None:
    """Write the held drafts' ids, and when any is a device tree every row's position, node bits
    and (exact steps) the ancestor relation, over the plan on the device (StepPlan.device_ids)."""
    rows = {seq: r for r, seq in enumerate(layout.seq_index.tolist())}
    for i in held_at:
        d = drafts[i]
        # any id the target knows keeps verification exact: an unknown one clamped
        d.device_tokens = d.device_tokens.clamp(0, vocab_size - 1)
        for at in plan.draft_offsets(i, rows[i], ks[i]):
            plan.device_ids.append((at, d.device_tokens))
    if not any(drafts[i].device_tree for i in held_at):
        return
    b, max_q = layout.num_seqs, layout.max_query_len
    parents = torch.full((b, max(max(ks), 1)), -1, dtype=torch.int64)
    for i, d in enumerate(drafts):
        if d is not None and ks[i] and not (isinstance(d, DeviceDraft) and d.device_tree):
            parents[i, :ks[i]] = torch.tensor(d.parents, dtype=torch.int64)
    parents = to_device(parents, device)
    for i in held_at:
        if drafts[i].device_tree:
            parents[i, :ks[i]].copy_(drafts[i].device_parents)
    q_lens, starts = layout.query_lens, layout.start_pos
    k_all = torch.tensor(ks, dtype=torch.int64)
    positions, _, ancestors = tree_rows(to_device(q_lens, device), to_device(k_all, device),
                                        to_device(starts, device), parents, max_q)
    bits = node_bits(ancestors, to_device(q_lens - k_all, device))
    seq_of = torch.repeat_interleave(torch.arange(b), q_lens)
    local = torch.arange(int(q_lens.sum())) - torch.repeat_interleave(layout.query_start,
                                                                      q_lens)
    packed = (seq_of * plan.max_query_len + local if plan.bucket is not None
              else torch.arange(local.numel()))
    at = plan.fields.offsets
    flat_index = to_device(seq_of * max_q + local, device)
    plan.device_ids.append((packed + at["positions"], positions.reshape(-1)[flat_index]))
    plan.device_ids.append((packed + at["node_bits"], bits.reshape(-1)[flat_index]))
    if plan.bucket is None:
        plan.ancestors = ancestors


def draft_ids(drafts: Sequence[Draft | None], device: torch.device) -> torch.Tensor:
    """Every draft node's id in batch order [D], on the device (held drafts' from there)."""
    parts = [d.device_tokens if isinstance(d, DeviceDraft) and d.on_device
             else to_device(torch.tensor(d.tokens, dtype=torch.int64), device)
             for d in drafts if d is not None and d.tokens]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=device)


def tree_parents(drafts: Sequence[Draft | None], device: torch.device) -> DeviceParents:
    """Every draft node's parent in batch order [D] on the device, with bounds on depth and
    children per node: a device tree's own, a host tree's counted here (a chain: k deep)."""
    parts, depth, width = [], 0, 1
    for d in drafts:
        if d is None or not d.tokens:
            continue
        if isinstance(d, DeviceDraft) and d.device_tree:
            parts.append(d.device_parents)
            depth, width = max(depth, d.max_depth), max(width, d.max_children)
            continue
        parts.append(to_device(torch.tensor(d.parents, dtype=torch.int64), device))
        levels, count = [0] * (len(d.parents) + 1), [0] * (len(d.parents) + 1)
        for n, p in enumerate(d.parents):
            levels[n + 1] = levels[p + 1] + 1
            count[p + 1] += 1
        depth, width = max(depth, max(levels)), max(width, max(count))
    return DeviceParents(torch.cat(parts), depth, width)


def device_q(d: Draft) -> SparseProbs | None:
    """The q a draft's nodes were drawn from (a held draft's, possibly read back already)."""
    if isinstance(d, DeviceDraft) and d.device_q is not None:
        return d.device_q
    return d.q


def q_guard(drafts: Sequence[Draft | None], device: torch.device
            ) -> tuple[torch.Tensor | None, list]:
    """The held drafts' q checked on the device, the collector's host check for a proposer's:
    finite, non-negative, each row summing to 1 (renormalised), each token in its support.
    Returns (bad [S] bool on the device, or None when no draft carries a device q; each draft's
    q to sample with, renormalised, a bad row's made harmless)."""
    out, bad, checked = [], [], False
    for d in drafts:
        q = device_q(d) if d is not None else None
        if q is None or not (isinstance(d, DeviceDraft) and d.device_q is not None):
            out.append(q)
            bad.append(torch.zeros((), dtype=torch.bool, device=device))
            continue
        checked = True
        idx, p = q.indices.to(device), q.probs.to(device=device, dtype=torch.float32)
        ids = (d.device_tokens if d.on_device
               else to_device(torch.tensor(d.tokens, dtype=torch.int64), device))
        total = p.sum(-1, keepdim=True)
        hit = torch.where(idx == ids[:, None], p, 0.0).sum(-1)
        wrong = (~torch.isfinite(p)).any() | (p < 0).any() | (
            (total - 1.0).abs() > Q_SUM_TOLERANCE).any() | ~(hit > 0).all()
        bad.append(wrong)
        # a bad row gets a valid one-hot at its token: the sampler's arithmetic stays finite,
        # and the sequence's result is replaced (`unaccept`)
        safe = torch.where(wrong, torch.zeros_like(p), p / total.clamp(min=1e-30))
        safe = torch.where(wrong & (torch.arange(p.shape[1], device=device) == 0), 1.0, safe)
        out.append(SparseProbs(torch.where(wrong, ids[:, None].expand_as(idx), idx), safe))
    return (torch.stack(bad) if checked else None), out


def unaccept(bad: torch.Tensor, tokens: torch.Tensor, num_accepted: torch.Tensor,
             nodes: torch.Tensor | None, root_tokens: torch.Tensor):
    """Rows `bad` [S]: their draft treated as empty, what the step emits for a sequence without
    one: no node accepted, one token drawn from the target at its root (root_tokens [S])."""
    first = torch.where(bad, root_tokens, tokens[:, 0])
    rest = torch.where(bad[:, None], PLACEHOLDER_TOKEN_ID, tokens[:, 1:])
    tokens = torch.cat([first[:, None], rest], 1)
    num_accepted = torch.where(bad, 0, num_accepted)
    if nodes is not None:
        nodes = torch.where(bad[:, None], -1, nodes)
    return tokens, num_accepted, nodes
