"""Continuous batching over the paged KV cache.

Requests join the running batch between steps while blocks allow, and leave it when they
finish. Before each step every running sequence reserves slots for what the step will write
(its uncached tokens + k drafts). Sequences that are decoding go first, oldest first; sequences
still prefilling then share what is left of the step's token budget (chunked prefill), so a long
prompt never stalls the others for a whole step. A chunk that does not finish a prompt emits no
token and asks no proposer.

When blocks run short, a sequence first gives up its speculation for the step, and then the
youngest sequences not yet scheduled this step are preempted: their blocks are freed and they go
back to the front of the queue, to be recomputed from their tokens when re-admitted (nothing
already streamed is lost or repeated; with prefix caching, verifier_service/batching/
prefix_cache.py, the blocks they had filled are found again rather than recomputed).

On a device that replays captured graphs (verifier_service/step/executor.py) a decode step is a
graph and a step with prompt rows is not: there prefill is scheduled apart (`mix_prefill`
False). When both kinds wait, steps alternate between all the decoding sequences and the
prefill chunks, so neither starves and every decode step stays captured.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Callable

from splitspec.errors import ResourceExhausted
from verifier_service.batching.prefix_cache import PrefixCache
from verifier_service.batching.sequence import SequenceState
from verifier_service.kv.cache import PagedKVCache


@dataclass
class Scheduled:
    """One sequence's share of a step."""

    seq: SequenceState
    num_new: int  # uncached tokens fed this step (a prefill chunk, or 1 when decoding)
    k: int  # draft tokens wanted (0 unless this step finishes the sequence's prefill)

    @property
    def emits(self) -> bool:
        """Whether the step emits tokens for it (it does once its prompt is all cached)."""
        return self.seq.num_computed + self.num_new == len(self.seq.tokens)


class Scheduler:
    def __init__(self, kv: PagedKVCache, max_num_seqs: int, max_waiting: int,
                 max_num_batched_tokens: int = 0,
                 on_admit: Callable[[SequenceState], None] | None = None,
                 on_preempt: Callable[[SequenceState], None] | None = None,
                 mix_prefill: bool = True, prefix: PrefixCache | None = None):
        self.kv = kv
        self.prefix = prefix  # None: no prefix caching (every prompt computed in full)
        # told when a sequence joins the running batch and when it is preempted out of it
        self.on_admit = on_admit
        self.on_preempt = on_preempt
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens  # 0: no limit
        self.max_waiting = max_waiting
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []  # ordered by arrival: oldest first
        self.num_preemptions = 0
        self.mix_prefill = mix_prefill
        self._prefill_turn = False  # mix_prefill False: whose turn it is when both wait

    def add(self, seq: SequenceState) -> None:
        if len(self.waiting) >= self.max_waiting:
            raise ResourceExhausted(f"the verifier's queue is full ({self.max_waiting} waiting "
                                    "requests); retry later")
        self.waiting.append(seq)

    def remove(self, seq: SequenceState) -> None:
        self.kv.release(seq.blocks)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def schedule(self, draft_budget: Callable[[SequenceState], int]) -> list[Scheduled]:
        """Admit, split the token budget, reserve slots, preempt if needed."""
        self._admit()
        budget = self.max_num_batched_tokens or float("inf")
        used = 0
        plan: list[Scheduled] = []
        planned: set[int] = set()
        # Decoding sequences (one uncached token) first, then prefills; oldest first in each.
        order = sorted(self.running, key=lambda s: (len(s.tokens) - s.num_computed > 1,
                                                    s.arrival))
        if not self.mix_prefill:
            order = self._one_kind(order)
        for seq in order:
            if seq not in self.running:
                continue  # preempted to make room for a sequence scheduled before it
            uncached = len(seq.tokens) - seq.num_computed
            num_new = uncached if uncached <= 1 else int(min(uncached, budget - used))
            if num_new <= 0:
                continue  # no budget left for this prefill this step
            k = draft_budget(seq) if num_new == uncached else 0
            if not self.kv.can_reserve(seq.blocks, seq.num_computed + num_new + k):
                k = 0  # blocks go to progress before speculation
            need = seq.num_computed + num_new + k
            while not self.kv.can_reserve(seq.blocks, need):
                victim = next(s for s in reversed(self.running) if id(s) not in planned)
                self._preempt(victim)
                if victim is seq:
                    break
            if seq in self.running:
                self.kv.reserve(seq.blocks, need)
                plan.append(Scheduled(seq, num_new, k))
                planned.add(id(seq))
                used += num_new + k
        return plan

    def _one_kind(self, order: list[SequenceState]) -> list[SequenceState]:
        """Decoding sequences or prefilling ones, in turns when both are running."""
        prefill = [s for s in order if len(s.tokens) - s.num_computed > 1]
        decode = [s for s in order if len(s.tokens) - s.num_computed <= 1]
        if prefill and decode:
            self._prefill_turn = not self._prefill_turn
            return prefill if self._prefill_turn else decode
        return order

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hits = self.prefix.hits(seq) if self.prefix is not None else []
            if not self.kv.can_admit(seq.blocks, len(seq.tokens), hits):
                break  # FIFO: no overtaking, so a long prompt is not starved
            self.waiting.popleft()
            if self.prefix is not None:
                self.prefix.admitted(seq, hits)
            keys = [s.arrival for s in self.running]
            self.running.insert(bisect.bisect(keys, seq.arrival), seq)
            if self.on_admit is not None:
                self.on_admit(seq)

    def _preempt(self, seq: SequenceState) -> None:
        self.kv.release(seq.blocks)
        seq.num_computed = 0  # recompute from its tokens when re-admitted
        self.running.remove(seq)
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        if self.on_preempt is not None:
            self.on_preempt(seq)
