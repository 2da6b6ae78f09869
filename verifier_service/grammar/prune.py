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
from verifier_service.methods.in_target import materialize

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
    q = None
    if draft.q is not None:
        at = torch.tensor(kept, device=draft.q.indices.device)
        q = SparseProbs(draft.q.indices.index_select(0, at), draft.q.probs.index_select(0, at))
    return Draft(draft.seq_id, [draft.tokens[n] for n in kept], q,
                 ahead_outcome=draft.ahead_outcome,
                 parents=[-1 if draft.parents[n] < 0 else index[draft.parents[n]]
                          for n in kept]), pruned
