"""Drafts a structured request's grammar forbids, pruned before the step is planned.

A draft node whose token the grammar forbids after its path is masked out of the target's row
before it: it would be rejected for certain, and so would its subtree. Pruning it spends no row
on it (and none on what hangs below it): the draft that goes to the step keeps the allowed nodes
in their order, each with its q row, parents renumbered. The verified tokens do not change: a
pruned node could never have been accepted.
"""

from __future__ import annotations

import torch

from kernels.sparse_probs import SparseProbs
from splitspec.proposal import Draft
from verifier_service.grammar.matcher import GrammarState
from verifier_service.methods.in_target import DeviceDraft, materialize

__all__ = ["prune_draft"]


def prune_draft(draft: Draft, grammar: GrammarState) -> tuple[Draft | None, int]:
    """(the draft with only the nodes the grammar allows, or None when none is; how many
    nodes were pruned). The draft itself when none is pruned."""
    draft = materialize(draft)  # ids an in-target head left on the device, read back
    kept = grammar.kept_nodes(draft.tokens, draft.parents)
    pruned = len(draft.tokens) - len(kept)
    if not pruned:
        return draft, 0
    if not kept:
        return None, pruned
    index = {node: i for i, node in enumerate(kept)}
    tokens = [draft.tokens[n] for n in kept]
    parents = [-1 if draft.parents[n] < 0 else index[draft.parents[n]] for n in kept]
    q = None if draft.q is None else _rows(draft.q, kept)
    if isinstance(draft, DeviceDraft) and draft.device_q is not None:
        # a head's q made on the device is still checked there by the step (a half-precision
        # head can give inf or NaN): it stays a device q
        return DeviceDraft(draft.seq_id, tokens, ahead_outcome=draft.ahead_outcome,
                           parents=parents, device_q=q), pruned
    return Draft(draft.seq_id, tokens, q, ahead_outcome=draft.ahead_outcome,
                 parents=parents), pruned


def _rows(q: SparseProbs, kept: list[int]) -> SparseProbs:
    at = torch.tensor(kept, device=q.indices.device)
    return SparseProbs(q.indices.index_select(0, at), q.probs.index_select(0, at))
