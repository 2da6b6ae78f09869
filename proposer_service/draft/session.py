"""The draft-model proposer's session: per sequence the token history (rebuilt from the
verifier's deltas) and the draft's cache state; each step's sequences drafted in batches by the
proposer (proposer_service/draft/proposer.py); and drafting ahead: while the verifier verifies,
drafting ahead for the step's likely outcomes (all accepted, and the likeliest rejections), so
that the next step's draft is ready when its outcome was among them.

A step that may branch (max_branch > 1) gets the chain with the draft's likeliest other tokens
as leaves (proposer_service/draft/branches.py) when drafted afresh; a step answered from drafting
ahead gets the chain drafted ahead, exactly what was pushed for it. Drafting ahead after a tree
follows the tree that was sent: the chain as far as it was kept, and for every leaf the outcome
"the leaf accepted, then a bonus token" (drafted like all-accepted: the first token drafted
ahead is the bonus token's guess).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Protocol

from kernels.sparse_probs import SparseProbs
from proposer_service.base import HistoryStore, ProposerSession, draft_in_batches
from proposer_service.draft.branches import branch_chain, kept_leaves
from proposer_service.draft.cache import SeqState
from proposer_service.draft.prefix import DraftPrefixCache
from proposer_service.draft.slots import DraftSlots
from splitspec.lean_llama import LeanDecoder
from splitspec.params import SamplingParams
from splitspec.proposal import (
    AHEAD_HIT,
    AHEAD_MISS,
    AheadDraft,
    Draft,
    SequenceStep,
)


class Drafter(Protocol):
    """What a session needs of its proposer (proposer_service/draft/proposer.py's
    DraftModelProposer)."""

    idle_timeout_s: float
    ahead_rejections: int
    lean: LeanDecoder | None  # the lean forward, when the model has one
    max_batch: int
    max_k: int
    max_positions: int
    drafts_ahead: bool
    prefixes: DraftPrefixCache  # finished sequences' caches, to start new ones from
    slots: DraftSlots | None  # the resident cache (None: every state keeps its own tensors)

    def bind(self, state: SeqState) -> None: ...

    def unbind(self, state: SeqState | None, keep_cache: bool = False) -> None: ...

    def draft_batch(self, work: list[tuple[SequenceStep, list[int], SeqState]],
                    cancel: threading.Event | None = None) -> list[Draft] | None: ...

    def draft_shared(self, step: SequenceStep, rows: list[tuple[int, int, int]],
                     state: SeqState, cancel: threading.Event, guess_row: int | None = None
                     ) -> list[tuple[Draft, SeqState]] | None: ...


@dataclass
class _AheadPlan:
    """A sequence to draft ahead for: its step, the history its last draft continued, that draft
    and the draft's state after it (a copy sharing the KV tensors)."""

    step: SequenceStep
    history: list[int]
    draft: Draft  # the chain as sent (a tree: its spine, the chain nodes it kept)
    state: SeqState
    leaves: frozenset[tuple[int, ...]] = frozenset()  # a tree's leaves: spine prefix + leaf

    def rejection_outcomes(self) -> list[tuple[int, ...]]:
        """The deltas of the likely rejections, likeliest first: the first n drafts accepted,
        then the draft's own best other token at position n + 1 as the recovered token. Scored
        by the draft's own probabilities: P(d_1..d_n accepted) * P(the guess), each taken as
        the draft model's probability of that token."""
        scored, reach = [], 1.0
        for n, (token, (ids, probs)) in enumerate(zip(self.draft.tokens,
                                                      self.state.alternatives)):
            guess = next(((a, p) for a, p in zip(ids, probs) if a != token), None)
            if guess is not None:
                scored.append((reach * guess[1], n, tuple(self.draft.tokens[:n]) + (guess[0],)))
            reach *= probs[ids.index(token)] if token in ids else 0.1
        return [delta for _, _, delta in sorted(scored, key=lambda x: (-x[0], x[1]))]


@dataclass
class _Ready:
    """Drafted ahead for one sequence: per outcome (the delta the verifier will send), the draft
    for the step after it and the draft state that goes with it."""

    k: int
    sampling: SamplingParams
    drafts: dict[tuple[int, ...], tuple[Draft, SeqState]]
    history_len: int = 0  # before the outcome: the history the step's draft continued


class DraftSession(ProposerSession):
    def __init__(self, proposer: Drafter):
        self._p = proposer
        self._store = HistoryStore(proposer.idle_timeout_s)
        self._states: dict[str, SeqState] = {}
        self._plans: dict[str, _AheadPlan] = {}  # asked to draft ahead, not yet drafted
        self._ready: dict[str, _Ready] = {}  # drafted ahead, waiting for the outcome

    def cached_tokens(self, seq_id: str) -> list[int]:
        """The tokens whose KV the draft holds for a sequence (its history, then own drafts)."""
        state = self._states.get(seq_id)
        return [] if state is None else list(state.cached)

    def cached_kv_length(self, seq_id: str) -> int:
        state = self._states.get(seq_id)
        return 0 if state is None or state.kv is None else state.kv[0][0].shape[2]

    def propose(self, steps: list[SequenceStep]) -> list[Draft]:
        for sid in self._store.evict_idle():
            self._finish(sid)
            self._ready.pop(sid, None)
        self._plans.clear()
        drafts: dict[str, Draft] = {}
        work: list[tuple[SequenceStep, list[int], SeqState]] = []
        missed: set[str] = set()  # drafted ahead for other outcomes: drafted afresh
        for step in steps:
            ready = self._ready.pop(step.seq_id, None)
            history = self._store.apply(step)
            if history is None or not history:
                self._p.unbind(self._states.pop(step.seq_id, None))
                drafts[step.seq_id] = Draft(step.seq_id, resync=True)
                continue
            state = self._states.get(step.seq_id)
            if state is None:  # new (or resynced): from a cached prefix where one matches
                state = self._states[step.seq_id] = self._p.prefixes.seed(
                    history, self._states.values())
                self._p.bind(state)
            k = min(step.k, self._p.max_k)
            if k <= 0 or len(history) + k > self._p.max_positions:
                # k = 0: just recorded (caught up lazily); past the draft's context: no drafts
                drafts[step.seq_id] = Draft(step.seq_id)
                continue
            step = dataclasses.replace(step, k=k) if k != step.k else step
            hit = self._take_ready(step, ready)
            if hit is not None:
                drafts[step.seq_id] = hit
                self._plan_ahead(step, history, hit)
                continue
            if ready is not None:
                missed.add(step.seq_id)
            work.append((step, list(history), state))
        for (step, history, state), d in zip(
                work, draft_in_batches(work, self._p.max_batch, self._p.draft_batch)):
            d.ahead_outcome = AHEAD_MISS if step.seq_id in missed else ""
            sent = self._tree(step, history, d, state) if step.max_branch > 1 else d
            self._plan_ahead(step, history, d, sent)  # the outcomes drafted ahead follow it
            drafts[d.seq_id] = sent
        return [drafts[s.seq_id] for s in steps]

    def _tree(self, step: SequenceStep, history: list[int], chain: Draft,
              state: SeqState) -> Draft:
        """The step's tree: the chain with the draft's other likely tokens as leaves, and the
        leaves that tree keeps grown into chains of their own, drafted in one batch over the
        shared cache (needs the lean forward; without it the leaves stay leaves)."""
        subtrees = {}
        k = len(chain.tokens)
        if self._p.lean is not None and k > 1 and not chain.resync:
            grow = [(n, t) for n, t in kept_leaves(chain, state.alternatives, step.k,
                                                   step.max_branch) if n < k - 1]
            rows = [(len(history) + n, t, k - n - 1) for n, t in grow]
            out = self._p.draft_shared(step, rows, state, threading.Event()) if rows else None
            subtrees = {leaf: (d, s.alternatives) for leaf, (d, s) in zip(grow, out or [])}
        return branch_chain(chain, state.alternatives, step.k, step.max_branch, subtrees)

    # -- drafting ahead ----------------------------------------------------------------------------

    def _take_ready(self, step: SequenceStep, ready: _Ready | None) -> Draft | None:
        """The draft drafted ahead for this step's outcome, its state made the sequence's; None
        on a miss (then the sequence is drafted afresh, never from a draft ahead of another
        outcome)."""
        k = step.k
        # a chain step wants its k tokens; a tree step's k is a node budget its chain may not
        # fill (the tree it replaces spent nodes on leaves)
        found = (None if ready is None or step.full_history
                 or (k > ready.k and step.max_branch <= 1) or step.sampling != ready.sampling
                 else ready.drafts.get(tuple(step.new_tokens)))
        if found is None:
            return None
        draft, state = found
        owner = self._states.get(step.seq_id)
        if owner is not None and owner.slot is not None:
            # the drafted-ahead state takes over the slot: only its new columns are copied in
            self._p.slots.adopt(state, owner)
        self._states[step.seq_id] = state
        q = None if draft.q is None else SparseProbs.from_rows(draft.q.rows()[:k])
        return Draft(step.seq_id, draft.tokens[:k], q, ahead_outcome=AHEAD_HIT)

    def _plan_ahead(self, step: SequenceStep, history: list[int], draft: Draft,
                    sent: Draft | None = None) -> None:
        """Plan drafting ahead for what `sent` (the draft's chain, or the tree made of it) may
        lead to."""
        spine, leaves = _spine_and_leaves(sent if sent is not None else draft)
        chain = draft if len(spine) == len(draft.tokens) else Draft(draft.seq_id, spine)
        k = len(chain.tokens)
        if (step.draft_ahead and self._p.drafts_ahead and k and not draft.resync
                and len(history) + 2 * k + 1 <= self._p.max_positions):
            state = self._states[step.seq_id]
            plan = _AheadPlan(step, list(history), chain, state.copy(), leaves)
            plan.state.alternatives = state.alternatives
            self._plans[step.seq_id] = plan

    def has_ahead_work(self) -> bool:
        return bool(self._plans)

    def ahead_may_hit(self, steps: list[SequenceStep]) -> bool:
        for step in steps:
            plan = self._plans.get(step.seq_id)
            if plan is None or step.full_history:
                continue
            delta, d = tuple(step.new_tokens), plan.draft.tokens
            if (len(delta) == len(d) + 1 and list(delta[:-1]) == d) or delta[:-1] in plan.leaves \
                    or delta in plan.rejection_outcomes()[:self._p.ahead_rejections]:
                return True
        return False

    def draft_ahead(self, cancel: threading.Event) -> None:
        """One batch over every planned sequence's likely outcomes, k drafts each:
        - all k accepted (PEARL's post-verify): keep drafting from d_k, k + 1 tokens; the first
          is the guess of the bonus token, the other k the draft for the step after it;
        - rejected at position n + 1 (SSD): history + d_1..d_n + the draft's best other token
          there (the recovered token's guess), k drafts.
        Rows are drafted as fresh ones would be (same positions, so the same keyed noise)."""
        plans = dict(self._plans)  # kept for ahead_may_hit until the next propose
        work, outcomes = [], []
        for sid, plan in plans.items():
            k, h, d = len(plan.draft.tokens), plan.history, plan.draft.tokens
            work.append((dataclasses.replace(plan.step, k=k + 1), h + d, plan.state.copy()))
            outcomes.append((sid, None))
            for delta in plan.rejection_outcomes()[:self._p.ahead_rejections]:
                leaf = delta in plan.leaves  # sent as a leaf: accepted, a bonus token follows
                work.append((dataclasses.replace(plan.step, k=k + leaf), h + list(delta),
                             plan.state.copy()))
                outcomes.append((sid, (delta, leaf)))
        # Entries first: a cancelled drafting ahead leaves them empty, so the step counts a miss.
        ready = {sid: _Ready(len(p.draft.tokens), p.step.sampling, {}, len(p.history))
                 for sid, p in plans.items()}
        self._ready.update(ready)
        if len(plans) == 1 and self._p.lean is not None:  # batch 1: rows share one cache
            plan = next(iter(plans.values()))
            n_hist, d = len(plan.history), plan.draft.tokens
            rows = [(n_hist + len(d) - 1, d[-1], len(d) + 1)] + [
                (n_hist + len(delta) - 1, delta[-1], len(d) + leaf)
                for _, (delta, leaf) in outcomes[1:]]
            shared = self._p.draft_shared(plan.step, rows, plan.state, cancel, guess_row=0)
            if shared is None:  # cancelled: keep nothing
                return
            results = [draft for draft, _ in shared]
            work = [(None, None, state) for _, state in shared]
        else:
            results = draft_in_batches(work, self._p.max_batch,
                                       lambda w: self._p.draft_batch(w, cancel) or [])
            if len(results) != len(work):  # cancelled: keep nothing
                return
        for (sid, outcome), (_, _, state), draft in zip(outcomes, work, results):
            entry = ready[sid]
            delta, bonus_first = ((tuple(plans[sid].draft.tokens), True) if outcome is None
                                  else outcome)
            if bonus_first:  # all accepted, or a leaf: the first token is the bonus's guess
                bonus, q = draft.tokens[0], draft.q
                delta = delta + (bonus,)
                draft = Draft(sid, draft.tokens[1:],
                              None if q is None else SparseProbs.from_rows(q.rows()[1:]))
                state.alternatives = state.alternatives[1:]
            entry.drafts[delta] = (draft, state)

    def ahead_drafts(self) -> list[AheadDraft]:
        # exactly what _take_ready answers for each outcome (cut to the step's k by both sides)
        return [AheadDraft(r.history_len + len(delta), delta, Draft(sid, d.tokens, d.q))
                for sid, r in self._ready.items() for delta, (d, _) in r.drafts.items()]

    def release(self, seq_ids: list[str]) -> None:
        self._store.release(seq_ids)
        for sid in seq_ids:
            self._finish(sid)
            self._ready.pop(sid, None)
            self._plans.pop(sid, None)

    def _finish(self, sid: str) -> None:
        """A finished sequence: its cache kept for prefix reuse (copied out of its slot), its
        slot freed."""
        state = self._states.pop(sid, None)
        if state is not None and state.slot is not None and self._p.prefixes.wants(state):
            self._p.unbind(state, keep_cache=True)
        self._p.unbind(state)
        self._p.prefixes.keep(state)

    def close(self) -> None:
        self._store.clear()
        for state in self._states.values():
            self._p.unbind(state)
        self._states.clear()
        self._ready.clear()
        self._plans.clear()


def _spine_and_leaves(sent: Draft) -> tuple[list[int], frozenset[tuple[int, ...]]]:
    """A draft as sent: its chain nodes (each node's first child, from the root down) and its
    leaves as outcomes (the spine up to the leaf's parent, then the leaf). A chain: itself, no
    leaves."""
    if sent.is_chain:
        return list(sent.tokens), frozenset()
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(sent.parents):
        children.setdefault(parent, []).append(node)
    spine: list[int] = []
    leaves = set()
    parent = -1
    while children.get(parent):
        first, *others = children[parent]
        leaves.update(tuple(spine) + (sent.tokens[o],) for o in others)
        spine.append(sent.tokens[first])
        parent = first
    return spine, frozenset(leaves)
