"""The in-target seam: a method registered with kind in_target drafts from inside the verifier,
beside proposer-backed sequences. A throwaway method proposing a fixed token chain keeps greedy
output identical to speculation off, alone, batched and under preemption; its per-sequence
states are created on admission and freed on finish, abort and preemption; no block leaks."""

from __future__ import annotations

import asyncio

import pytest
from engine_testlib import PROMPTS, collect, drained, make_engine, request, run_all

from splitspec.methods import METHODS, Capabilities, Kind, MethodSpec, in_target_methods
from verifier_service.methods.in_target import InTargetMethod, InTargetState, StepOutcome

NAME = "fixed-chain"


class FixedChain(InTargetMethod):
    """Proposes the same token ids for every sequence at every step (`chain`, set per test)."""

    chain: list[int] = []
    instances: list["FixedChain"] = []

    def __init__(self):
        self.admitted = self.freed = 0
        self.outcomes: list[StepOutcome] = []
        FixedChain.instances.append(self)

    def admit(self, request_id, tokens, sampling, plan) -> InTargetState:
        self.admitted += 1
        return _FixedState(self)


class _FixedState(InTargetState):
    def __init__(self, method: FixedChain):
        self.method = method

    def propose(self, tokens, k):
        return FixedChain.chain[:k]

    def observe(self, outcome: StepOutcome) -> None:
        self.method.outcomes.append(outcome)

    def free(self) -> None:
        self.method.freed += 1


@pytest.fixture
def fixed_chain(monkeypatch):
    """The method in the registry for one test (what a product method's registry line does)."""
    monkeypatch.setitem(METHODS, NAME, MethodSpec(
        NAME, "a fixed token chain", f"{__name__}:FixedChain", Capabilities(),
        kind=Kind.IN_TARGET))
    monkeypatch.setattr(FixedChain, "instances", [])
    return FixedChain


@pytest.fixture(scope="module")
def baseline(target_model_dir):
    """Greedy output of the first prompts alone, speculation off."""
    out = {}
    for i, p in enumerate(PROMPTS[:4]):
        engine = make_engine(target_model_dir)
        (res,) = asyncio.run(run_all(engine, [request(engine, f"b{i}", p, k=0)]))
        out[p] = res[0]
    return out


def _served(engine) -> FixedChain:
    (method,) = FixedChain.instances
    assert engine.drafts.in_target.methods[NAME] is method
    return method


def test_registry_kind_in_target_has_no_process(fixed_chain):
    from splitspec.launcher import StackConfig
    from splitspec.methods import proposer_methods

    assert NAME in in_target_methods() and NAME not in proposer_methods()
    assert NAME not in StackConfig().proposers and NAME not in StackConfig.with_free_ports(
    ).proposers


def test_fixed_chain_alone_equals_speculation_off(target_model_dir, baseline, fixed_chain):
    prompt = PROMPTS[0]
    fixed_chain.chain = baseline[prompt][:4]  # accepted whole where it fits, rejected elsewhere
    engine = make_engine(target_model_dir, proposers={})
    method = _served(engine)
    # what Info lists and direct clients get: every in-target method, no proposer here
    # (the model-free ones: lookahead, the grammar's forced tokens, and this one)
    assert set(engine.drafts.served_methods()) == {
        m for m, spec in in_target_methods().items() if not spec.capabilities.needs_model}
    (res,) = asyncio.run(run_all(engine, [request(engine, "a", prompt, method=NAME, k=4)]))
    tokens, _, last = res
    assert tokens == baseline[prompt]
    assert last.usage.method == NAME and last.usage.proposed_tokens > 0
    assert 4 <= last.usage.accepted_tokens < last.usage.proposed_tokens
    assert method.admitted == method.freed == 1 and engine.drafts.in_target.num_states == 0
    assert [o.num_accepted for o in method.outcomes][0] == 4  # told each step's outcome
    assert all(o.emitted[:o.num_accepted] == o.draft[:o.num_accepted] for o in method.outcomes)
    # its drafting time, inside the step, is recorded as its answer time (what auto prices)
    trips = engine.stats.method(NAME).round_trips
    assert set(trips) == {4} and 0 < trips[4][0] <= len(method.outcomes) and trips[4][1] > 0
    assert drained(engine)



def test_what_a_method_spends_learning_from_a_step_is_priced_as_its_own(
        target_model_dir, baseline, fixed_chain, monkeypatch):
    """An in-target state's observe (an EAGLE head's layer over the kept rows) runs inside the
    step, after the forward: it is the method's cost, priced with its drafting (what auto and
    the adaptive k read), and kept out of the step-cost curve every method's rows are priced
    by."""
    import time

    slow = 0.2
    observe = _FixedState.observe
    # the clock the engine and the in-target states time with runs `slow` ahead during every
    # observe: a method that spends that long learning from each step, with nothing slept
    real, ahead = time.perf_counter, [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: real() + ahead[0])

    def slow_observe(self, outcome):
        ahead[0] += slow
        observe(self, outcome)

    monkeypatch.setattr(_FixedState, "observe", slow_observe)
    prompt = PROMPTS[0]
    fixed_chain.chain = baseline[prompt][:4]
    engine = make_engine(target_model_dir, proposers={})
    (res,) = asyncio.run(run_all(engine, [request(engine, "a", prompt, max_tokens=12,
                                                  method=NAME, k=4)]))
    assert res[0] == baseline[prompt][:12]
    n, seconds = engine.stats.method(NAME).round_trips[4]
    # each ask after the first carries the observe of the step before it
    assert seconds >= slow * (n - 1) * 0.9, (n, seconds)
    decoding = [b for b in engine.stats.step_cost if b.steps]
    per_step = sum(b.seconds_total for b in decoding) / sum(b.steps for b in decoding)
    assert per_step < slow / 2, per_step  # the target's step alone
    assert drained(engine)


def test_fixed_chain_batched_with_proposer_backed_and_plain_sequences(
        target_model_dir, baseline, fixed_chain):
    fixed_chain.chain = baseline[PROMPTS[2]][:3]
    engine = make_engine(target_model_dir, max_num_seqs=8)  # the n-gram proposer too
    method = _served(engine)
    plans = [(NAME, 3), ("ngram", 3), (None, 0), (NAME, 2)]
    results = asyncio.run(run_all(engine, [request(engine, f"m{i}", p, method=m, k=k)
                                           for i, (p, (m, k)) in enumerate(zip(PROMPTS, plans))]))
    for p, (m, _), (tokens, _, last) in zip(PROMPTS, plans, results):
        assert tokens == baseline[p], (p, m)
        assert last.usage.method == m
    assert results[0][2].usage.proposed_tokens > 0 and results[1][2].usage.proposed_tokens > 0
    assert engine.snapshot().per_method[NAME].steps > 0
    assert method.admitted == method.freed == 2
    assert drained(engine)


def test_states_are_freed_on_preemption_and_abort(target_model_dir, fixed_chain):
    fixed_chain.chain = [11, 12, 13]

    async def run(**cfg):
        engine = make_engine(target_model_dir, proposers={}, **cfg)
        engine.start()
        try:
            res = await asyncio.gather(*(collect(engine, request(engine, f"p{i}", p,
                                                                 max_tokens=40, method=NAME,
                                                                 k=3))
                                         for i, p in enumerate(PROMPTS)))
            # an abort mid-stream frees its state too
            seq = engine.add_request(request(engine, "gone", PROMPTS[0], max_tokens=40,
                                             method=NAME, k=3))
            await seq.outputs.get()
            engine.abort("gone")
            while engine.num_in_flight:
                await asyncio.sleep(0.01)
            return [r[0] for r in res], engine, _served(engine)
        finally:
            await engine.shutdown()

    roomy, _, _ = asyncio.run(run(max_num_seqs=8))
    FixedChain.instances.clear()
    tight, engine, method = asyncio.run(run(max_num_seqs=8, block_size=4, num_kv_blocks=45))
    assert engine.scheduler.num_preemptions > 0 and tight == roomy
    # every admission (first ones and re-admissions after preemption) freed exactly once
    assert method.admitted == method.freed > len(PROMPTS) + 1
    assert engine.drafts.in_target.num_states == 0 and drained(engine)
