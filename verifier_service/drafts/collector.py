"""Collecting one step's drafts from the proposers and the in-target methods, and never trusting
them.

In-target methods (verifier_service/methods/in_target.py) are asked in place, each for its step's
sequences together (first learning what the last step kept for it). Per proposer, one message
carries every speculating sequence's new tokens and k (plus what the proposer declared it
conditions on, e.g. the target's hidden state); all proposers are asked
concurrently and awaited until the per-step deadline. Whatever comes back is checked before the
verifier uses it: wrong lengths, unknown ids, or a q that cannot have produced its token drop
that sequence's draft, and the step decodes it plainly.

A hybrid's sequence is asked of each of its components and their drafts merged into one tree
(kernels/hybrid_merge.py). A gated hybrid ("hybrid:suffix|eagle") asks its tiers in turn: the
first tier's proposers with everyone else's, then a later tier only for the sequences whose
earlier tiers drafted too little (`hybrid_merge.tier_suffices`); in-target methods draft after
every proposer has answered, so an EAGLE head in the last tier drafts only where retrieval found
nothing, at no extra wait.

A proposer that is late, gone, or incompatible (a different vocabulary: e.g. a pod replaced by
a wrong image) costs only speculation. An incompatible one is refused at every reconnection
attempt until a compatible one answers; meanwhile its method counts as unavailable in the stats.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Sequence

import torch

import kernels.hybrid_merge as hybrid_merge
from kernels.sparse_probs import SparseProbs
from splitspec.methods import components_of, hybrid_components, hybrid_tiers
from splitspec.proposal import (
    AHEAD_HIT,
    AHEAD_MISS,
    AHEAD_PUSHED,
    Draft,
    SequenceStep,
)
from verifier_service.batching.scheduler import Scheduled
from verifier_service.batching.sequence import SequenceState
from verifier_service.drafts.ahead_policy import AheadPolicy
from verifier_service.drafts.client import ProposerClient, ProposerMismatch
from verifier_service.methods.in_target import InTargetDrafts, StepOutcome, materialize
from verifier_service.telemetry.stats import EngineStats, MethodStats, MethodStepStats

log = logging.getLogger(__name__)

UNAVAILABLE = "proposer_unavailable"
INCOMPATIBLE = "proposer_incompatible"


class DraftCollector:
    def __init__(self, proposers: dict[str, ProposerClient], vocab_size: int, timeout_s: float,
                 stats: EngineStats, draft_ahead: str = "auto",
                 in_target: InTargetDrafts | None = None):
        self.proposers = proposers
        self.in_target = in_target if in_target is not None else InTargetDrafts({})
        # whether to ask proposers that declare drafts_ahead to draft ahead, per method
        self.ahead_policy = AheadPolicy(draft_ahead)
        self.vocab_size = vocab_size
        self.timeout_s = timeout_s
        self.stats = stats
        self.incompatible: dict[str, str] = {}  # method -> why it is refused right now

    def serves(self, method: str | None) -> bool:
        """Whether drafts for `method` can be had here (a proposer or an in-target method; a
        hybrid: every one of its components)."""
        parts = hybrid_components(method)
        if parts is not None:
            return all(self.serves(p) for p in parts)
        return method in self.proposers or self.in_target.serves(method)

    def served_methods(self) -> tuple[str, ...]:
        """Every method drafts can be asked of: the proposers, then the in-target methods."""
        return (*self.proposers, *(m for m in self.in_target.methods if m not in self.proposers))

    def needs_hidden_state(self, seq: SequenceState) -> bool:
        """Whether the sequence's proposer (one of a hybrid's) declared that it conditions on
        the target's state."""
        for method in components_of(seq.inp.speculation.method):
            client = self.proposers.get(method)
            desc = client.description if client is not None else None
            if desc is not None and desc.needs_hidden_state:
                return True
        return False

    async def collect(self, plan: list[Scheduled]
                      ) -> tuple[dict[SequenceState, Draft], dict[str, MethodStepStats]]:
        # in-target states that kept the last step's outcome learn from it now, together,
        # whether or not they draft this step: a standing cost of their sequences
        for method, (seconds, sequences) in self.in_target.flush().items():
            self.stats.method(method).add_standing(seconds, sequences)
        by_method: dict[str, list[Scheduled]] = {}  # every method asked, with its sequences
        hybrids: dict[str, list[Scheduled]] = {}  # a hybrid's sequences, asked of each component
        gated: list[Scheduled] = []  # of those, the ones whose later tiers wait on earlier ones
        for s in plan:
            if s.k > 0:
                method = s.seq.inp.speculation.method
                tiers = hybrid_tiers(method)
                if tiers is not None:
                    hybrids.setdefault(method, []).append(s)
                    if len(tiers) > 1:
                        gated.append(s)
                for m in (tiers[0] if tiers is not None else (method,)):
                    by_method.setdefault(m, []).append(s)
        for method, client in self.proposers.items():
            if method not in by_method and client.has_released:
                await client.flush_released()
        step_stats = {m: MethodStepStats() for m in hybrids}
        got: dict[str, dict[SequenceState, Draft]] = {}
        await self._ask_all(by_method, got, step_stats)
        # gated hybrids: a later tier only for the sequences whose earlier tiers drafted too
        # little (their tiers are proposers: in-target methods draft once, below)
        tier_of = {s.seq: 0 for s in gated}
        while gated:
            later: dict[str, list[Scheduled]] = {}
            waiting = []
            for s in gated:
                tiers, t = hybrid_tiers(s.seq.inp.speculation.method), tier_of[s.seq]
                drafts = [got.get(p, {}).get(s.seq) for p in tiers[t]]
                if t + 1 == len(tiers) or hybrid_merge.tier_suffices(
                        [_candidate(d) for d in drafts if d is not None and d.tokens], s.k):
                    continue
                tier_of[s.seq] = t + 1
                for m in tiers[t + 1]:
                    later.setdefault(m, []).append(s)
                    by_method.setdefault(m, []).append(s)
                waiting.append(s)
            await self._ask_all(later, got, step_stats)
            gated = waiting
        for m, group in by_method.items():
            if self.in_target.serves(m):
                got[m] = self._in_target(m, group, step_stats.setdefault(m, MethodStepStats()))
        merged: dict[SequenceState, Draft] = {}
        for drafts in got.values():
            merged.update((seq, d) for seq, d in drafts.items()
                          if hybrid_components(seq.inp.speculation.method) is None)
        for name, group in hybrids.items():
            merged.update(self._hybrid(name, group, got, step_stats, tier_of))
        return merged, step_stats

    async def _ask_all(self, groups: dict[str, list[Scheduled]],
                       got: dict[str, dict[SequenceState, Draft]],
                       step_stats: dict[str, MethodStepStats]) -> None:
        """Ask the groups' proposers together (in-target methods are asked after every
        proposer); their drafts into `got`, their step's account into `step_stats` (a method
        asked again in the same step, for a gated hybrid's later tier, adds to it)."""
        asked = [m for m in groups if not self.in_target.serves(m)]
        fresh = {m: MethodStepStats() for m in asked}
        results = await asyncio.gather(*(self._ask(m, groups[m], fresh[m]) for m in asked))
        for m, drafts in zip(asked, results):
            got.setdefault(m, {}).update(drafts)
            if m in step_stats:
                _add_step(step_stats[m], fresh[m])
            else:
                step_stats[m] = fresh[m]

    def _hybrid(self, name: str, group: list[Scheduled],
                got: dict[str, dict[SequenceState, Draft]],
                step_stats: dict[str, MethodStepStats],
                tier_of: dict[SequenceState, int]) -> dict[SequenceState, Draft]:
        """Each of a hybrid's sequences' component drafts merged into one tree within its k
        (kernels/hybrid_merge.py: common prefixes once, each node its own drafter's q); a gated
        hybrid's, those of the tiers it asked (`tier_of`: the last one asked)."""
        tiers = hybrid_tiers(name)
        parts = hybrid_components(name)
        stats, ms = self.stats.method(name), step_stats[name]
        stats.steps += 1
        # its components (its tiers one after another) are waited for: the step waits for all
        timed = [step_stats[p].round_trip_s for p in parts if p in step_stats
                 and step_stats[p].round_trip_s is not None]
        if timed:
            ms.round_trip_s = sum(timed)
            stats.add_round_trip(max(s.k for s in group), ms.round_trip_s, seqs=len(group))
        out = {}
        for s in group:
            seq = s.seq
            (stats.greedy if seq.inp.sampling.greedy else stats.sampled).asked += 1
            asked = [p for tier in tiers[:tier_of.get(seq, len(tiers) - 1) + 1] for p in tier]
            drafts = [got.get(p, {}).get(seq) for p in asked]
            candidates = [_candidate(d) for d in drafts if d is not None and d.tokens]
            if not candidates:
                continue
            sampling = seq.inp.sampling
            tree = hybrid_merge.merge_candidates(
                candidates, s.k, merge_sampled=sampling.greedy or sampling.seed is not None)
            rows = tree.q_rows()
            draft = Draft(seq.request_id, tree.tokens,
                          SparseProbs.from_rows(rows) if rows is not None else None,
                          parents=tree.parents)
            checked = self.checked(draft, s.k, max_branch=s.k)
            if checked is not None:
                out[seq] = checked
            else:
                ms.garbage += 1
        return out

    def _in_target(self, method: str, group: list[Scheduled], ms: MethodStepStats
                   ) -> dict[SequenceState, Draft]:
        """Candidates from an in-target method's per-sequence states, checked as a proposer's."""
        stats = self.stats.method(method)
        stats.steps += 1
        out: dict[SequenceState, Draft] = {}
        wanted = {s.seq: s.k for s in group}
        start = time.perf_counter()
        proposals = self.in_target.propose(group, method)
        # its drafting runs inside the step, before the forward: priced like a proposer's
        # answer time (an EAGLE head's k forwards cost a share of a target step), together with
        # what its states spent learning from the last verified step (the head's layer over the
        # kept rows): work the method alone costs a step
        ms.round_trip_s = (time.perf_counter() - start
                           + self.in_target.take_observe_seconds(method))
        if wanted:  # each sequence's own: the states draft one after another
            stats.add_round_trip(max(wanted.values()), ms.round_trip_s / len(wanted),
                                 seqs=len(wanted))
        for seq, proposed in proposals.items():
            k = wanted[seq]
            _count_ask(stats, seq, k)
            draft = (proposed if isinstance(proposed, Draft)
                     else Draft(seq.request_id, list(proposed)))
            if not draft.tokens:
                continue
            checked = self.checked(draft, k, max_branch=k)  # its own shape, within budget
            if checked is not None:
                out[seq] = checked
            else:
                ms.garbage += 1
        return out

    async def _ask(self, method: str, group: list[Scheduled], ms: MethodStepStats
                   ) -> dict[SequenceState, Draft]:
        client = self.proposers[method]
        stats = self.stats.method(method)
        stats.steps += 1
        if not await self._connected(method, client, group):
            stats.missed_steps += 1
            ms.missed = True
            return {}
        desc = client.description
        ms.ahead = desc is not None and desc.drafts_ahead and self.ahead_policy.use(method)
        steps, wanted = self._messages(client, group, ms.ahead)
        if not steps:
            return {}
        for seq, k in wanted.values():  # sent a request for a draft: answered or not
            _count_ask(stats, seq, k)
        start = time.perf_counter()
        drafts = await client.propose(steps, self.timeout_s)
        if drafts is None:
            stats.missed_steps += 1
            ms.missed = True
            return {}
        ms.round_trip_s = time.perf_counter() - start
        if not any(st.full_history for st in steps):
            # The policy's round-trip model is of a step's usual answer; a sequence's first ask
            # (its whole history: a draft model prefills the prompt) would dominate the fit
            # while there are only a few calls, and make a fresh stack pause drafting.
            stats.add_round_trip(max(s.k for s in group), ms.round_trip_s, seqs=len(steps))
        out: dict[SequenceState, Draft] = {}
        for d in drafts:
            if d.seq_id not in wanted:
                continue
            seq, k = wanted.pop(d.seq_id)
            if d.ahead_outcome in (AHEAD_HIT, AHEAD_PUSHED):
                stats.ahead_hits += 1
                ms.ahead_hits += 1
                if d.ahead_outcome == AHEAD_PUSHED:
                    stats.ahead_pushed += 1
                    ms.ahead_pushed += 1
            elif d.ahead_outcome == AHEAD_MISS:
                stats.ahead_misses += 1
                ms.ahead_misses += 1
            if d.resync:
                seq.proposer_marks.pop(method, None)  # full history on the next step
                ms.resyncs += 1
                continue
            checked = (self.checked(d, k, seq.inp.speculation.num_branches) if d.tokens
                       else None)
            if checked is not None:
                out[seq] = checked
            elif d.tokens:
                ms.garbage += 1
        return out

    async def _connected(self, method: str, client: ProposerClient,
                         group: list[Scheduled]) -> bool:
        try:
            ok = await client.ensure_connected()
        except ProposerMismatch as exc:
            if self.incompatible.get(method) != str(exc):
                log.error("disabling speculation with %s: %s", method, exc)
            self.incompatible[method] = str(exc)
            self.stats.method(method).unavailable = INCOMPATIBLE
            for s in group:
                s.seq.speculation_reason = INCOMPATIBLE
            return False
        if method in self.incompatible and ok:
            log.info("%s proposer is compatible again", method)
            del self.incompatible[method]
        self.stats.method(method).unavailable = "" if ok else UNAVAILABLE
        if not ok:
            for s in group:
                s.seq.speculation_reason = s.seq.speculation_reason or UNAVAILABLE
        return ok

    @staticmethod
    def _messages(client: ProposerClient, group: list[Scheduled], ahead: bool
                  ) -> tuple[list[SequenceStep], dict[str, tuple[SequenceState, int]]]:
        """One SequenceStep per sequence: only what the proposer has not heard yet, unless its
        stream is new (another epoch), then the whole history. With `ahead`, the proposer is
        asked to draft the next step ahead while this one is verified."""
        desc = client.description
        needs_hidden = desc is not None and desc.needs_hidden_state
        steps, wanted = [], {}
        for s in group:
            seq = s.seq
            if needs_hidden and seq.target_hidden is None:
                continue  # before the first verification there is no hidden state yet
            heard, epoch = seq.proposer_marks.get(client.method, (0, -1))
            full = epoch != client.epoch
            new = seq.tokens if full else seq.tokens[heard:]
            steps.append(SequenceStep(seq.request_id, list(new), len(seq.tokens), s.k,
                                      full_history=full, sampling=seq.inp.sampling,
                                      hidden_state=seq.target_hidden if needs_hidden else None,
                                      draft_ahead=ahead,
                                      max_branch=seq.inp.speculation.num_branches,
                                      ngram_min=seq.inp.speculation.prompt_lookup_min,
                                      ngram_max=seq.inp.speculation.prompt_lookup_max))
            wanted[seq.request_id] = (seq, s.k)
            seq.proposer_marks[client.method] = (len(seq.tokens), client.epoch)
        return steps, wanted

    def checked(self, d: Draft, k: int, max_branch: int = 1) -> Draft | None:
        """The draft with its q renormalised, or None (not used) for wrong lengths, unknown ids,
        a tree that is not one (or branches more than the step allows), or a q that cannot have
        produced its token."""
        if len(d.tokens) > k or any(not 0 <= t < self.vocab_size for t in d.tokens):
            return None
        if d.tree_error(k, max_branch) is not None:
            return None
        if d.q is None:
            return d
        idx, p = d.q.indices, d.q.probs.to(torch.float32)
        if idx.shape[0] != len(d.tokens) or idx.numel() == 0:
            return None
        if bool((idx < 0).any() or (idx >= self.vocab_size).any()):
            return None
        if not bool(torch.isfinite(p).all()) or bool((p < 0).any()):
            return None
        total = p.sum(-1, keepdim=True)
        if bool(((total - 1.0).abs() > 1e-3).any()):
            return None
        q = SparseProbs(idx, p / total)
        # each token must have positive probability under the q it claims to come from
        if not bool((q.prob_of(torch.tensor(d.tokens)) > 0).all()):
            return None
        return Draft(d.seq_id, list(d.tokens), q, parents=list(d.parents))

    # -- a sequence's life: in-target states live while it runs; proposers hear of its end ----

    def admitted(self, seq: SequenceState) -> None:
        """It joined the running batch (new, or re-admitted after a preemption)."""
        self.in_target.admit(seq)

    def preempted(self, seq: SequenceState) -> None:
        """It left the running batch to be recomputed later (a proposer keeps its history)."""
        self.in_target.free(seq)

    def observe(self, seq: SequenceState, draft: Draft | None, num_accepted: int,
                emitted: list[int], path: Sequence[int] = (),
                node_argmax: Sequence[int] = (), features=None, position: int = 0) -> None:
        """A verified step's outcome, for the in-target state that drafted (or may draft) it:
        what learning from it took is the method's standing cost per sequence and step."""
        spent = self.in_target.observe(seq, StepOutcome(
            list(draft.tokens) if draft else [], num_accepted, list(emitted),
            list(draft.parents) if draft else [], list(path), list(node_argmax), seq.tokens,
            features, position))
        if spent is not None:
            self.stats.method(seq.inp.speculation.method).add_standing(spent)

    def release(self, seq: SequenceState) -> None:
        """It finished, was aborted or failed."""
        self.in_target.free(seq)
        for method in components_of(seq.inp.speculation.method):
            client = self.proposers.get(method)
            if client is not None and seq.proposer_marks.get(method, (0, -1))[1] == client.epoch:
                client.release([seq.request_id])


def _candidate(d: Draft) -> hybrid_merge.Candidate:
    """A checked draft as the merge reads it (ids an in-target head left on the device, read
    back: the merge compares them)."""
    d = materialize(d)  # ids, a tree's parents and q an in-target head left on the device
    return hybrid_merge.Candidate(list(d.tokens), list(d.parents),
                                  d.q.rows() if d.q is not None else None)


def _add_step(into: MethodStepStats, more: MethodStepStats) -> None:
    """A method's second ask in one step (a gated hybrid's later tier) added to its first."""
    if more.round_trip_s is not None:
        into.round_trip_s = (into.round_trip_s or 0.0) + more.round_trip_s
    into.missed = into.missed or more.missed
    into.ahead = into.ahead or more.ahead
    for name in ("garbage", "ahead_hits", "ahead_misses", "ahead_pushed", "resyncs"):
        setattr(into, name, getattr(into, name) + getattr(more, name))


def _count_ask(stats: MethodStats, seq: SequenceState, k: int) -> None:
    """The sequence asked its method for k tokens this step (answered or not)."""
    seq.asked += 1
    seq.asked_k = k
    (stats.greedy if seq.inp.sampling.greedy else stats.sampled).asked += 1
