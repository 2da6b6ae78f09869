"""A step's token-tree rows built on the device: positions, parents and the ancestor mask from
the drafts' parent indices, with no value read back to the host.

kernels/layout.py builds the same three on the host from Python lists (`StepLayout.build` with
`draft_parents`): that needs the tree's parents on the host, so a tree drafted on the device (an
EAGLE-2 head's, kernels/eagle_tree.py) must be read back before its step can be planned. Here
every input is a tensor that may stay on the device and every shape is fixed by host integers
the plan knows anyway (the step's widest sequence `max_q`), so the whole construction can be
queued behind the drafting and captured in a graph. SGLang builds its EAGLE tree masks on the
device the same way (a kernel over the selected candidates' parent list); this is the same idea
as plain tensor ops.

Per sequence b, fed rows j < query_lens[b]: first its uncached tokens as a chain (row j's parent
j - 1, row 0's the cache), the last of them the *root*, then its num_drafts[b] draft nodes;
draft d's parent is draft_parents[b, d]: -1 (the root) or an earlier draft. The ancestor
relation is the transitive closure of "parent or self", by repeated squaring of the boolean
parent matrix (after s squarings it holds every path of up to 2^s edges, so ceil(log2(max_q))
squarings hold all of them); a row's depth is its number of ancestors (itself excluded) and its
position start_pos + depth, as the host's.
"""

from __future__ import annotations

import math

import torch

__all__ = ["node_bits", "tree_rows"]


def _closure_steps(max_q: int) -> int:
    """Squarings that make every path of up to max_q - 1 edges one edge."""
    return max(0, math.ceil(math.log2(max(max_q - 1, 1))))


def tree_rows(query_lens: torch.Tensor, num_drafts: torch.Tensor, start_pos: torch.Tensor,
              draft_parents: torch.Tensor, max_q: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """query_lens, num_drafts, start_pos: int64 [B]; draft_parents: int64 [B, max_k] (entries
    past a sequence's num_drafts are ignored); max_q >= every query_lens (a host int). Returns
    positions [B, max_q] int64, parents [B, max_q] int64 (fed-row index, -1: the cache) and
    ancestors [B, max_q, max_q] bool ([b, j, a]: row a is row j or an ancestor of it), padding
    rows (j >= query_lens[b]) all zero / -1 / False. Assumes what the host checks of a draft
    (kernels/layout.py, splitspec/proposal.py): 0 <= num_drafts < query_lens and each parent in
    [-1, d)."""
    device = query_lens.device
    b = query_lens.shape[0]
    j = torch.arange(max_q, device=device)[None, :]  # [1, max_q]
    q, k = query_lens[:, None], num_drafts[:, None]
    root = q - k - 1  # fed index of the last uncached token
    valid = j < q  # [B, max_q]
    max_k = draft_parents.shape[1]
    if max_k:
        d = (j - root - 1).clamp(0, max_k - 1)
        given = draft_parents.gather(1, d)  # [B, max_q]: each row's draft parent, if a draft
        from_tree = torch.where(given >= 0, root + 1 + given, root)
        parents = torch.where(j > root, from_tree, j - 1)
    else:
        parents = (j - 1).expand(b, max_q)
    parents = torch.where(valid, parents, torch.full_like(parents, -1))
    a = torch.arange(max_q, device=device)
    pair = valid[:, :, None] & valid[:, None, :]
    rel = ((a[None, None, :] == parents[:, :, None]) | (a[None, None, :] == j[:, :, None])) & pair
    m = rel.to(torch.float32)
    for _ in range(_closure_steps(max_q)):
        m = ((m + torch.bmm(m, m)) > 0).to(torch.float32)
    ancestors = m > 0
    depth = ancestors.sum(-1) - 1  # ancestors among the fed rows, itself excluded
    positions = torch.where(valid, start_pos[:, None] + depth, torch.zeros_like(depth))
    return positions, parents, ancestors


def node_bits(ancestors: torch.Tensor, first_node: torch.Tensor) -> torch.Tensor:
    """int64 [B, max_q]: per fed row, bit m set for every draft node m among its ancestors and
    itself, draft node m being fed row first_node[b] + m (0 for rows before first_node): what
    the plan's node_bits hold (verifier_service/step/plan.py), from `tree_rows`' ancestors
    [B, max_q, max_q] and first_node int64 [B], on their device. Bit 63 is the sign bit: a sum
    of distinct powers of two wraps to the same bits."""
    max_q = ancestors.shape[-1]
    a = torch.arange(max_q, device=ancestors.device)
    node = a[None, :] - first_node[:, None]  # [B, max_q]: each column's node index
    weight = torch.where(node >= 0, torch.ones_like(node) << node.clamp(0, 63),
                         torch.zeros_like(node))
    bits = (ancestors.to(torch.int64) * weight[:, None, :]).sum(-1)
    return torch.where(node >= 0, bits, torch.zeros_like(bits))
