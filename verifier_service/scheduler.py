"""Continuous batching over the paged KV cache.

Requests join the running batch between steps while blocks allow, and leave it when they
finish. Before each step every running sequence reserves slots for what the step will write
(its uncached tokens + k drafts), oldest first. When blocks run short, a sequence first gives up
its speculation for the step, and then the youngest running sequences are preempted: their
blocks are freed and they go back to the front of the queue, to be recomputed from their tokens
when re-admitted (nothing already streamed is lost or repeated).
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Callable

from splitspec.errors import ResourceExhausted
from verifier_service.kv_cache import PagedKVCache
from verifier_service.sequence import Sequence


class Scheduler:
    def __init__(self, kv: PagedKVCache, max_num_seqs: int, max_waiting: int):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_waiting = max_waiting
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # ordered by arrival: oldest first
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        if len(self.waiting) >= self.max_waiting:
            raise ResourceExhausted(f"the verifier's queue is full ({self.max_waiting} waiting "
                                    "requests); retry later")
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        self.kv.release(seq.blocks)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def schedule(self, draft_budget: Callable[[Sequence], int]) -> list[tuple[Sequence, int]]:
        """Admit, reserve slots, preempt if needed; returns (sequence, k) for this step."""
        self._admit()
        plan: list[tuple[Sequence, int]] = []
        for seq in list(self.running):
            if seq not in self.running:
                continue  # preempted below to make room for an older sequence
            k = draft_budget(seq)
            if not self.kv.can_reserve(seq.blocks, len(seq.tokens) + k):
                k = 0  # blocks go to progress before speculation
            need = len(seq.tokens) + k
            while not self.kv.can_reserve(seq.blocks, need):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq in self.running:
                self.kv.reserve(seq.blocks, need)
                plan.append((seq, k))
        return plan

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.kv.can_reserve(seq.blocks, len(seq.tokens)):
                break  # FIFO: no overtaking, so a long prompt is not starved
            self.waiting.popleft()
            keys = [s.arrival for s in self.running]
            self.running.insert(bisect.bisect(keys, seq.arrival), seq)

    def _preempt(self, seq: Sequence) -> None:
        self.kv.release(seq.blocks)
        seq.num_computed = 0  # recompute from its tokens when re-admitted
        self.running.remove(seq)
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
