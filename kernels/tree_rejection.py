"""Lossless verification of a *tree* of draft tokens per sequence (multi-draft rejection sampling).

A tree per sequence i: nodes 0 .. N_i - 1, node d a token and a parent (-1: the root, i.e. the
sequence's last emitted token; parents precede children, parent < d), siblings in the proposer's
rank order. A chain is the tree with parents d - 1. Ragged layout, as the chain sampler's with
k_i = N_i:
    target_probs    [T, V], T = sum_i (N_i + 1): for sequence i, N_i + 1 contiguous rows: row 0 is
                    p at the root, row r + 1 is p after node r's token (given its ancestors).
    draft_token_ids [D], D = sum_i N_i, node tokens flattened in batch order.
    draft_parents   S entries, each None (a chain) or N_i parents (local node indices, -1: root);
                    or None: the trees of the StepLayout (kernels/layout.py, its `parents`), which
                    must agree with the given ones when that layout carries trees; or
                    DeviceParents: every node's parent as an int64 [D] tensor that may still be
                    on the device (a head drafted the tree there), with host bounds on its depth
                    and its children per node: the walk's shape comes from the bounds, the
                    children table and each row's depth are built on the device, nothing is
                    read back (`_device_trees`).
    draft_probs     None (every node deterministic, one-hot), dense [D, V] or SparseProbs (D rows):
                    per node, the distribution *that node* was drawn from.

Walk from the root, per unseeded sampled sequence. At the current node with target p, try its
children c_1, c_2, ... in order: accept c_k (drawn from q_k) iff u_k * q_k(c_k) < p(c_k); on a
rejection p <- normalize(max(0, p - q_k)) and try the next sibling; on acceptance descend to c_k
with its own target row. When every child is rejected, emit one token from the final residual p
(exponential race with the sequence's pre-drawn E row); at a node without children emit the bonus
token from its row. A deterministic child is the one-hot case: accepted with probability p(c),
else p with c removed.

Why it is lossless (SpecInfer's multi-draft argument), by induction over the siblings from the
last: with no sibling left the token is drawn from p itself. Before sibling k, given everything
drawn so far (earlier siblings' tokens and uniforms), c_k ~ q_k and u_k is fresh, so one
Leviathan/Chen step either emits c_k (probability min(p, q_k) at each token) or hands the
normalized residual max(0, p - q_k) to the remaining procedure, which by induction emits from
exactly that residual: the mixture is p. Nothing asks q_k to be the same for all siblings or
independent of earlier ones, only that c_k really was drawn from the q_k sent with it; so a
proposer drawing siblings without replacement sends each sibling's conditioned q (earlier tokens
removed, renormalised), and a deterministic sibling sends its one-hot. After an acceptance the
subtree under c_k was drawn given c_k, so the walk restarts there with c_k's row: every depth,
the bonus included, is distributed as the target.

Greedy rows descend to the first child whose token is argmax(p) of the current row and emit the
argmax where none is. Seeded rows do the same with the keyed choice g = argmax(p / E(seed,
position)), position = the sequence's sample position + depth (the chain sampler's keys), so a
seeded sequence's tokens are the same whatever the tree, and the same as with trees off.

Random numbers (unseeded sampled rows only), all drawn before any compute from the default RNG,
exactly as the chain sampler draws them (so a chain sees the very same numbers):
    u  [D]     one uniform per node;
    E  [S, V]  Exp(1) noise, one row per sequence (exactly one non-draft token per sequence).

The reference loops over depth and sibling rank with tensor ops across the batch;
kernels/triton_tree_rejection.py is the same walk, one program per sequence, fed the same randoms
and choices (as kernels/triton_rejection.py is for chains).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from kernels.layout import PLACEHOLDER_TOKEN_ID, RejectionResult, StepLayout
from kernels.rejection import (
    LayoutLike,
    _draft_prob_at,
    _draft_rows_dense,
    _host_bools,
    _seeded_rows,
    _use_triton,
    _validate,
    as_layout,
    draw_uniforms,
)
from kernels.sampler_inputs import DraftProbs
from kernels.sampling import (
    draw_exponentials,
    key_halves,
    keyed_argmax,
    keyed_exponentials_at,
    noise_key,
)

__all__ = ["DeviceParents", "TreeResult", "layout_draft_parents", "path_rows",
           "tree_rejection_sample"]

Parents = Optional[Sequence[int]]


@dataclass(frozen=True)
class DeviceParents:
    """A batch's tree shapes as a tensor: parents int64 [D] (node d of sequence i at
    draft_offsets[i] + d, its parent a local index, -1 the root; parents precede children), and
    host ints no tree of the batch exceeds: its depth and its children per node (a head knows
    them before drafting: its levels and its top-k). Nodes past the bounds are never visited."""

    parents: torch.Tensor
    max_depth: int
    max_children: int


@dataclass
class TreeResult(RejectionResult):
    """RejectionResult over trees: output_token_ids int64 [S, max_depth + 1] (the accepted path's
    tokens, then the recovered/bonus token, PLACEHOLDER_TOKEN_ID padded), num_accepted int64 [S],
    plus accepted_nodes int64 [S, max_depth]: the path's node indices (root excluded), -1 padded,
    and fed_before int64 [S] (CPU): rows each sequence fed ahead of its draft nodes."""

    accepted_nodes: torch.Tensor = None  # int64 [S, max_depth]
    fed_before: torch.Tensor = None  # int64 [S]

    def paths(self) -> list[list[int]]:
        """Accepted node indices per sequence (host copy)."""
        nodes = self.accepted_nodes.cpu().tolist()
        return [row[:n] for row, n in zip(nodes, self.num_accepted.cpu().tolist())]

    def kept_rows(self) -> list[list[int]]:
        """Per sequence, the fed rows to keep in the KV cache (verifier_service/kv/cache.py
        `keep`): `path_rows` of its path."""
        return [path_rows(n, path) for n, path in zip(self.fed_before.tolist(), self.paths())]


def path_rows(fed_before: int, path: Sequence[int]) -> list[int]:
    """The fed rows a sequence keeps after a tree step: every row fed before its draft nodes,
    then the accepted path's nodes (node d is fed row fed_before + d)."""
    return list(range(fed_before)) + [fed_before + d for d in path]


@dataclass(frozen=True)
class _Trees:
    """Host-side shape of the batch's trees."""

    children: torch.Tensor  # int64 [S, max_n + 1, max_children]: global node index, -1 padded;
    # slot 0 is the root, slot r + 1 node r
    row_depth: list[list[int]]  # per sequence, depth of each of its N_i + 1 target rows
    max_depth: int
    max_children: int
    # DeviceParents: int64 [T] the depth of every target row, on the device (row_depth unused)
    depth_rows: Optional[torch.Tensor] = None


def _trees(draft_parents: Sequence[Parents], ks: list[int], offsets: list[int]) -> _Trees:
    if len(draft_parents) != len(ks):
        raise ValueError(f"draft_parents has {len(draft_parents)} entries for a batch of "
                         f"{len(ks)}")
    at: list[list[int]] = [[], [], [], []]  # (sequence, slot, rank, global node) per node
    depths: list[list[int]] = []
    width = 0
    for i, (given, n, off) in enumerate(zip(draft_parents, ks, offsets)):
        parents = list(range(-1, n - 1)) if given is None else [int(p) for p in given]
        if len(parents) != n:
            raise ValueError(f"sequence {i}: {len(parents)} parents for {n} draft nodes")
        rank = [0] * (n + 1)
        depth = [0]
        for d, p in enumerate(parents):
            if not -1 <= p < d:  # parents precede children: no cycle, topological order
                raise ValueError(f"sequence {i}: node {d}'s parent {p} is not in [-1, {d})")
            for column, value in zip(at, (i, p + 1, rank[p + 1], off + d)):
                column.append(value)
            rank[p + 1] += 1
            depth.append(depth[p + 1] + 1)
        width = max(width, max(rank))
        depths.append(depth)
    children = torch.full((len(ks), max(ks, default=0) + 1, max(width, 1)), -1,
                          dtype=torch.int64)
    seq, slot, rank_of, node = (torch.tensor(c, dtype=torch.int64) for c in at)
    children[seq, slot, rank_of] = node
    max_depth = max((max(d) for d in depths), default=0)
    return _Trees(children, depths, max_depth, width)


def _sibling_ranks(seq: torch.Tensor, local: torch.Tensor, parents: torch.Tensor
                   ) -> torch.Tensor:
    """Each node's rank among its siblings [D]: the earlier nodes of its own sequence with the
    same parent (nodes of seq [D], local index [D], parent [D])."""
    earlier = (seq[None, :] == seq[:, None]) & (local[None, :] < local[:, None])  # [D, D]
    return (earlier & (parents[None, :] == parents[:, None])).sum(1)


def _device_trees(given: DeviceParents, ks: list[int], offsets: list[int], toff: list[int],
                  device: torch.device) -> _Trees:
    """`_trees` from parents on the device, at the shapes the host bounds fix: the children
    table [S, max_n + 1, max_children] (a node's rank among its siblings: the earlier nodes of
    its sequence with the same parent) and every target row's depth, with no value read back."""
    b, width, n_max = len(ks), max(given.max_children, 1), max(ks, default=0)
    d_total = sum(ks)
    parents = given.parents.reshape(-1).to(device=device, dtype=torch.int64)
    seq_host = torch.repeat_interleave(torch.arange(b), torch.tensor(ks, dtype=torch.int64))
    local_host = torch.arange(d_total) - torch.repeat_interleave(
        torch.tensor(offsets, dtype=torch.int64), torch.tensor(ks, dtype=torch.int64))
    seq = seq_host.to(device, non_blocking=True)
    local = local_host.to(device, non_blocking=True)
    rank = _sibling_ranks(seq, local, parents)
    # one spare column takes a rank past the bound (never visited), so indices stay distinct
    flat = torch.full((b * (n_max + 1) * (width + 1),), -1, dtype=torch.int64, device=device)
    at = (seq * (n_max + 1) + parents + 1) * (width + 1) + rank.clamp(max=width)
    flat.index_copy_(0, at, torch.arange(d_total, device=device))
    children = flat.view(b, n_max + 1, width + 1)[:, :, :width]
    # depth: one more than the parent's, settled level by level (max_depth passes)
    off = torch.tensor(offsets, dtype=torch.int64).to(device, non_blocking=True)
    up = torch.where(parents >= 0, off[seq] + parents, -1)  # global index of the parent
    depth = torch.ones(d_total, dtype=torch.int64, device=device)
    for _ in range(max(given.max_depth - 1, 0)):
        depth = torch.where(up >= 0, depth[up.clamp(min=0)] + 1, 1) if d_total else depth
    rows = torch.zeros(sum(ks) + b, dtype=torch.int64, device=device)
    node_rows = torch.tensor(toff, dtype=torch.int64)[seq_host] + local_host + 1
    rows.index_copy_(0, node_rows.to(device, non_blocking=True), depth)
    return _Trees(children, [], given.max_depth if d_total else 0, width, rows)


def _choices(target_probs: torch.Tensor, trees: _Trees, toff: list[int], pos: list[int],
             seeded: list[int], seeds: Sequence[Optional[int]]) -> torch.Tensor:
    """The deterministic rows' choice per target row [T]: argmax, or for a seeded sequence the
    keyed sample at position sample_position + depth of the row."""
    choice = target_probs.argmax(dim=-1)
    if seeded and trees.depth_rows is not None:
        # depths on the device: every key a row might take (depth 0 .. max_depth) from the
        # host, the row's own picked there
        ks = [toff[i + 1] - toff[i] if i + 1 < len(toff) else target_probs.shape[0] - toff[i]
              for i in range(len(toff))]
        rows = [toff[i] + r for i in seeded for r in range(ks[i])]
        span = trees.max_depth + 1
        table = key_halves([noise_key(seeds[i], pos[i] + d) for i in seeded
                            for d in range(span)]).view(len(seeded), span, 2)
        which = torch.tensor([n for n, i in enumerate(seeded) for _ in range(ks[i])],
                             dtype=torch.int64)
        dev = target_probs.device
        idx = torch.tensor(rows, dtype=torch.int64).to(dev, non_blocking=True)
        depth = trees.depth_rows[idx].clamp(max=trees.max_depth)
        halves = table.to(dev, non_blocking=True)[which.to(dev, non_blocking=True), depth]
        vocab = target_probs.shape[1]
        index = torch.arange(vocab, device=dev).expand(len(rows), vocab)
        choice[idx] = (target_probs[idx].to(torch.float32)
                       / keyed_exponentials_at(halves, index)).argmax(dim=-1)
        return choice
    if seeded:
        rows = [toff[i] + r for i in seeded for r in range(len(trees.row_depth[i]))]
        keys = [noise_key(seeds[i], pos[i] + d) for i in seeded for d in trees.row_depth[i]]
        idx = torch.tensor(rows, dtype=torch.int64).to(target_probs.device, non_blocking=True)
        choice[idx] = keyed_argmax(target_probs[idx], keys)
    return choice


def _residual(r: torch.Tensor, z: torch.Tensor, q: torch.Tensor,
              rejected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """After rows `rejected` [B] rejected a child drawn from q [B, V]: their target p = r / z
    becomes max(0, p - q) (kept unnormalised in r [B, V], its sum in z [B]). A residual that is
    zero everywhere can only come from rounding (p == q), then p stays."""
    res = (r / z.unsqueeze(1) - q).clamp_(min=0.0)
    res = torch.where((res > 0).any(dim=1, keepdim=True), res, r / z.unsqueeze(1))
    r = torch.where(rejected.unsqueeze(1), res, r)
    return r, torch.where(rejected, res.sum(dim=1), z)


def layout_draft_parents(layout: StepLayout) -> list[list[int]]:
    """Per emitting sequence, its draft nodes' parents (local, -1: the root) as the layout
    placed them: the tree attention saw."""
    parents = layout.parents.tolist()
    out = []
    for b, k in zip(layout.seq_index.tolist(), layout.num_draft_tokens.tolist()):
        first = int(layout.query_start[b]) + int(layout.query_lens[b]) - k  # fed row of node 0
        root = first - 1 - int(layout.query_start[b])  # fed index of the root
        out.append([parents[first + d] - root - 1 for d in range(k)])
    return out


def tree_rejection_sample(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_parents: Union[None, Sequence[Parents], DeviceParents],
    layout: LayoutLike,
    draft_probs: DraftProbs,
    is_greedy: Union[torch.Tensor, Sequence[bool]],
    seeds: Optional[Sequence[Optional[int]]] = None,
    impl: str = "auto",
) -> TreeResult:
    """Lossless verification of a ragged batch of draft trees (see the module docstring).

    target_probs [T, V]; draft_token_ids int64 [D]; draft_parents: S entries, None (a chain) or
    N_i parents, or None (the StepLayout's trees), or DeviceParents (parents left on the device,
    shaped by host bounds: the layout's trees are placeholders then); layout: the step's StepLayout
    (num_draft_tokens = N_i) or num_nodes int64 [S] (sample positions 1, 1, ...); draft_probs
    None | dense [D, V] | SparseProbs (D rows); is_greedy bool [S]; seeds: S entries of
    int | None (None for all: unseeded). impl: "auto" (Triton on CUDA/MLU when available) |
    "reference" | "triton" (kernels/triton_tree_rejection.py, fed the same randoms and choices).
    """
    step_layout = isinstance(layout, StepLayout)
    layout = as_layout(layout)
    draft_token_ids = draft_token_ids.reshape(-1).to(torch.int64)
    _validate(target_probs, draft_token_ids, layout, draft_probs)
    on_device = isinstance(draft_parents, DeviceParents)
    if on_device:
        if draft_parents.parents.numel() != layout.num_drafts:
            raise ValueError(f"{draft_parents.parents.numel()} device parents for "
                             f"{layout.num_drafts} draft nodes")
    elif draft_parents is None:
        if not step_layout:
            raise ValueError("draft_parents is needed unless the layout is a StepLayout")
        draft_parents = layout_draft_parents(layout)
    elif step_layout and not layout.chain:
        given = [list(range(-1, k - 1)) if p is None else [int(x) for x in p]
                 for p, k in zip(draft_parents, layout.num_draft_tokens.tolist())]
        if given != layout_draft_parents(layout):
            raise ValueError("draft_parents differ from the trees the step layout placed")
    device, vocab, b = target_probs.device, target_probs.shape[1], layout.batch_size
    ks, doff = layout.num_draft_tokens.tolist(), layout.draft_offsets.tolist()
    toff, pos = layout.target_offsets.tolist(), layout.sample_positions.tolist()
    trees = (_device_trees(draft_parents, ks, doff, toff, device) if on_device
             else _trees(draft_parents, ks, doff))
    greedy_host = _host_bools(is_greedy, b, "is_greedy")
    seeded = _seeded_rows(greedy_host, seeds, b)
    det_host = greedy_host.clone()
    det_host[seeded] = True  # seeded rows are decided by their keyed choice, as greedy by argmax
    sampled_rows = [i for i, g in enumerate(det_host.tolist()) if not g]

    # all randomness first, in the chain sampler's order: uniforms, then noise
    uniforms = draw_uniforms(layout, sampled_rows, device) if sampled_rows else None
    exps = draw_exponentials(b, vocab, device) if sampled_rows else None
    choice = (_choices(target_probs, trees, toff, pos, seeded, seeds)
              if len(sampled_rows) < b else None)

    fed_before = layout.query_lens[layout.seq_index] - layout.num_draft_tokens
    if _use_triton(device, impl):
        from kernels.triton_tree_rejection import tree_rejection_sample_triton

        out, nodes, num_accepted = tree_rejection_sample_triton(
            target_probs, draft_token_ids, draft_probs, trees.children, trees.max_depth,
            layout.draft_offsets, layout.target_offsets, det_host, uniforms, exps, choice)
        return TreeResult(output_token_ids=out, num_accepted=num_accepted, accepted_nodes=nodes,
                          fed_before=fed_before)

    det = det_host.to(device, non_blocking=True)  # [S]
    sampled = ~det
    seq = torch.arange(b, device=device)
    children = trees.children.to(device, non_blocking=True)  # [S, max_n + 1, C]
    t_off = layout.target_offsets.to(device, non_blocking=True)  # [S]
    d_off = layout.draft_offsets.to(device, non_blocking=True)  # [S]
    max_depth = trees.max_depth
    out = torch.full((b, max_depth + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    nodes = torch.full((b, max_depth), -1, dtype=torch.int64, device=device)
    num_accepted = torch.zeros(b, dtype=torch.int64, device=device)
    cur = torch.zeros(b, dtype=torch.int64, device=device)  # slot: 0 root, r + 1 node r
    active = torch.ones(b, dtype=torch.bool, device=device)

    for depth in range(max_depth + 1):
        row = t_off + cur  # [S] target row of the current node
        r = target_probs[row].to(torch.float32) if sampled_rows else None  # [S, V]
        z = torch.ones(b, dtype=torch.float32, device=device)  # [S] sum of r (a target row: 1)
        took = torch.full((b,), -1, dtype=torch.int64, device=device)  # accepted child (global)
        for c in range(trees.max_children):
            child = children[seq, cur, c]  # [S]
            trying = active & (child >= 0) & (took < 0)
            safe = child.clamp(min=0)
            tok = draft_token_ids[safe] if draft_token_ids.numel() else child  # [S]
            accept = torch.zeros(b, dtype=torch.bool, device=device)
            if sampled_rows:
                q_tok = _draft_prob_at(draft_probs, safe, tok)  # [S]
                p_tok = r.gather(1, tok.clamp(min=0).unsqueeze(1)).squeeze(1) / z
                accept = uniforms[safe] * q_tok < p_tok  # with prob min(1, p / q)
                rejected = trying & sampled & ~accept
                q = _draft_rows_dense(draft_probs, draft_token_ids, safe, rejected, vocab)
                r, z = _residual(r, z, q, rejected)
            if choice is not None:
                accept = torch.where(det, tok == choice[row], accept)
            took = torch.where(trying & accept, child, took)
        descend = took >= 0
        stop = active & ~descend
        extra = torch.zeros(b, dtype=torch.int64, device=device)
        if sampled_rows:  # exponential race over the (unnormalised) residual or bonus row
            extra = (r / exps).argmax(dim=1)
        if choice is not None:
            extra = torch.where(det, choice[row], extra)
        tokens = draft_token_ids[took.clamp(min=0)] if draft_token_ids.numel() else extra
        out[:, depth] = torch.where(descend, tokens, torch.where(stop, extra, out[:, depth]))
        if depth < max_depth:
            nodes[:, depth] = torch.where(descend, took - d_off, nodes[:, depth])
        num_accepted += descend.to(torch.int64)
        cur = torch.where(descend, took - d_off + 1, cur)
        active = descend

    return TreeResult(output_token_ids=out, num_accepted=num_accepted, accepted_nodes=nodes,
                      fed_before=fed_before)
