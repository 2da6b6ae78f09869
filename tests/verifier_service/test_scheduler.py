"""The scheduler on a small in-memory KV cache: admission, the order and token budget of a step,
draft budgets, and what happens when blocks run short (speculation first, then preemption of the
youngest)."""

from __future__ import annotations

import pytest
import torch

from splitspec.errors import ResourceExhausted
from splitspec.params import GenerationInput, SpeculationPlan
from verifier_service.batching.scheduler import Scheduler
from verifier_service.batching.sequence import SequenceState
from verifier_service.kv.cache import KVCacheSpec, PagedKVCache

BLOCK = 4


def _kv(num_blocks: int) -> PagedKVCache:
    spec = KVCacheSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=torch.float32,
                       block_size=BLOCK, num_blocks=num_blocks)
    return PagedKVCache(spec, torch.device("cpu"))


def _seq(name: str, prompt_len: int, arrival: float) -> SequenceState:
    # the scheduler reads tokens, the cache state and arrival only: no output tracker needed
    inp = GenerationInput(name, tuple(range(1, prompt_len + 1)),
                          speculation=SpeculationPlan("ngram", 3))
    return SequenceState(inp=inp, tracker=None, arrival=arrival)


def _decoding(seq: SequenceState) -> SequenceState:
    """As after its prefill: every token but the last cached."""
    seq.num_computed = len(seq.tokens) - 1
    return seq


class Events:
    def __init__(self):
        self.admitted, self.preempted = [], []


def _scheduler(kv, events=None, **kw) -> Scheduler:
    events = events or Events()
    return Scheduler(kv, kw.pop("max_num_seqs", 8), kw.pop("max_waiting", 8),
                     on_admit=lambda s: events.admitted.append(s.request_id),
                     on_preempt=lambda s: events.preempted.append(s.request_id), **kw)


def _run(sched: Scheduler, plan) -> None:
    """What a step does to the scheduled sequences' cache state (nothing accepted or emitted
    beyond one token per emitting sequence)."""
    for s in plan:
        emits = s.emits
        s.seq.num_computed += s.num_new
        sched.kv.truncate(s.seq.blocks, s.seq.num_computed)
        if emits:
            s.seq.tokens.append(7)


def test_admission_is_fifo_within_seats_and_blocks():
    kv, events = _kv(6), Events()
    sched = _scheduler(kv, events, max_num_seqs=2)
    a, b, c = _seq("a", 5, 1.0), _seq("b", 3, 2.0), _seq("c", 2, 3.0)
    for s in (a, b, c):
        sched.add(s)
    plan = sched.schedule(lambda s: 0)
    assert [s.seq.request_id for s in plan] == ["a", "b"]  # two seats
    assert events.admitted == ["a", "b"] and list(sched.waiting) == [c]
    assert [(s.num_new, s.k, s.emits) for s in plan] == [(5, 0, True), (3, 0, True)]
    assert len(a.blocks) == 2 and len(b.blocks) == 1


def test_a_long_prompt_at_the_head_is_not_overtaken():
    kv = _kv(3)
    sched = _scheduler(kv)
    sched.add(_seq("long", 20, 1.0))  # needs 5 blocks: never fits now
    sched.add(_seq("short", 2, 2.0))
    assert sched.schedule(lambda s: 0) == [] and len(sched.waiting) == 2


def test_decodes_go_first_then_prefills_share_the_token_budget_in_chunks():
    kv = _kv(32)
    sched = _scheduler(kv, max_num_batched_tokens=8)
    old_prefill = _seq("p1", 10, 1.0)
    young_prefill = _seq("p2", 6, 2.0)
    decoder = _decoding(_seq("d", 4, 3.0))
    for s in (old_prefill, young_prefill, decoder):
        sched.add(s)
    plan = sched.schedule(lambda s: 2)
    # the decode (1 token + k = 2 drafts) first, then the oldest prefill takes the rest: a chunk
    # that does not finish its prompt drafts nothing and emits nothing
    assert [(s.seq.request_id, s.num_new, s.k, s.emits) for s in plan] == [
        ("d", 1, 2, True), ("p1", 5, 0, False)]
    assert kv.slots(decoder.blocks, 0, 6).numel() == 6  # reserved: 3 cached + 1 new + 2 drafts
    _run(sched, plan)
    plan = sched.schedule(lambda s: 2)
    assert [(s.seq.request_id, s.num_new, s.k, s.emits) for s in plan] == [
        ("d", 1, 2, True), ("p1", 5, 2, True)]  # finishes p1's prompt: it may draft


def test_apart_from_prefill_decoding_and_prefill_steps_take_turns():
    """Where decode steps are captured graphs, a step is all decoding or all prompt rows; when
    both wait they alternate, so neither starves."""
    kv = _kv(32)
    sched = _scheduler(kv, max_num_batched_tokens=8)
    sched.mix_prefill = False
    prefill = _seq("p", 12, 1.0)
    decoder = _decoding(_seq("d", 4, 2.0))
    for s in (prefill, decoder):
        sched.add(s)
    kinds = []
    for _ in range(4):
        plan = sched.schedule(lambda s: 2)
        kinds.append(sorted(s.seq.request_id for s in plan))
        _run(sched, plan)
    # p's prompt takes two chunks (8 + 4 tokens); d decodes in between; then both decode
    assert kinds == [["p"], ["d"], ["p"], ["d", "p"]]


def test_speculation_is_dropped_before_anyone_is_preempted():
    kv = _kv(2)
    sched = _scheduler(kv)
    seq = _decoding(_seq("a", 7, 1.0))  # 6 cached + 1 new fits 2 blocks; drafts would not
    sched.add(seq)
    (s,) = sched.schedule(lambda s: 3)
    assert (s.num_new, s.k) == (1, 0) and sched.num_preemptions == 0


def test_the_youngest_is_preempted_and_goes_back_to_the_front_of_the_queue():
    kv, events = _kv(4), Events()
    sched = _scheduler(kv, events)
    old, young = _decoding(_seq("old", 8, 1.0)), _decoding(_seq("young", 7, 2.0))
    waiting = _seq("later", 3, 3.0)
    for s in (old, young):
        sched.add(s)
    sched.schedule(lambda s: 0)  # old: 2 blocks, young: 2 blocks; the cache is full
    sched.add(waiting)
    old.num_computed = len(old.tokens)  # its step ran: one more token to feed next
    old.tokens.append(7)  # position 8: old needs a third block
    plan = sched.schedule(lambda s: 0)
    assert [s.seq.request_id for s in plan] == ["old"]
    assert events.preempted == ["young"] and sched.num_preemptions == 1
    assert young.num_computed == 0 and len(young.blocks) == 0  # recomputed when re-admitted
    assert list(sched.waiting) == [young, waiting]  # ahead of what arrived after it
    assert kv.num_free_blocks == 1


def test_queue_limit_and_remove_release_blocks():
    kv = _kv(8)
    sched = _scheduler(kv, max_waiting=1)
    a = _seq("a", 5, 1.0)
    sched.add(a)
    with pytest.raises(ResourceExhausted, match="queue is full"):
        sched.add(_seq("b", 5, 2.0))
    sched.schedule(lambda s: 0)
    assert kv.num_free_blocks == 6
    sched.remove(a)
    assert kv.num_free_blocks == 8 and not sched.running and not sched.waiting
