"""Token trees through the engine: a test method (in-target, so no process is needed) drafts trees
whose first-ranked child is wrong and whose second child is the target's true greedy token, with
the true branch continuing below it. Greedy output equals speculation off, alone and batched with
chains and plain sequences, under preemption; the accepted path's K/V is what a plain decode would
have cached (the output after the tree steps is identical), every block comes back, and usage
counts branch hits. Seeded sampled output is identical with trees on and off; malformed trees cost
only speculation."""

from __future__ import annotations

import asyncio
import dataclasses

import planted_bugs as bug
import pytest
from engine_testlib import PROMPTS, collect, drained, make_engine, request, run_all

from splitspec.methods import METHODS, Capabilities, Kind, MethodSpec
from splitspec.params import SamplingParams
from splitspec.proposal import Draft
from verifier_service.methods.in_target import InTargetMethod, InTargetState

NAME = "oracle-tree"


class OracleTree(InTargetMethod):
    """Knows each prompt's greedy continuation (`reference`, set per test) and drafts a tree:
    at every depth a wrong first child (a leaf) and the true token second, going on below it.
    `mangle` (set per test) may break the tree to exercise the checks."""

    reference: dict[tuple[int, ...], list[int]] = {}
    mangle = None

    def admit(self, request_id, tokens, sampling, plan) -> InTargetState:
        # re-admitted after a preemption, `tokens` is the prompt and the output so far
        prompt = next(p for p in self.reference if tuple(tokens[:len(p)]) == p)
        return _OracleState(request_id, prompt, self.vocab)

    @classmethod
    def from_verifier(cls, vocab_size: int, config=None) -> "OracleTree":
        m = cls()
        m.vocab = vocab_size
        return m


class _OracleState(InTargetState):
    def __init__(self, request_id, prompt, vocab):
        self.request_id, self.prompt, self.vocab = request_id, prompt, vocab

    def propose(self, tokens, k):
        true = OracleTree.reference[self.prompt][len(tokens) - len(self.prompt):]
        toks, parents, parent = [], [], -1
        for t in true[: k // 2]:
            toks += [(t + 1) % self.vocab, t]
            parents += [parent, parent]
            parent = len(toks) - 1
        draft = Draft(self.request_id, toks, parents=parents)
        return OracleTree.mangle(draft) if OracleTree.mangle else draft


@pytest.fixture
def oracle(monkeypatch):
    monkeypatch.setitem(METHODS, NAME, MethodSpec(
        NAME, "a tree around the true continuation", f"{__name__}:OracleTree", Capabilities(),
        kind=Kind.IN_TARGET))
    monkeypatch.setattr(OracleTree, "mangle", None)
    return OracleTree


def _tree(engine, rid, prompt, k=8, branches=2, **kw):
    inp = request(engine, rid, prompt, method=NAME, k=k, **kw)
    plan = dataclasses.replace(inp.speculation, num_branches=branches)
    return dataclasses.replace(inp, speculation=plan)


@pytest.fixture(scope="module")
def greedy_off(target_model_dir):
    """Greedy output of four prompts (40 tokens), speculation off, and the reference the oracle
    drafts from (a few tokens longer, so the last steps still get a tree)."""
    engine = make_engine(target_model_dir)
    res = asyncio.run(run_all(engine, [request(engine, f"b{i}", p, max_tokens=48, k=0)
                                       for i, p in enumerate(PROMPTS[:4])]))
    ids = [tuple(engine.tokenizer.encode(p, add_special_tokens=False)) for p in PROMPTS[:4]]
    return {p: r[0] for p, r in zip(PROMPTS[:4], res)}, dict(zip(ids, (r[0] for r in res)))


def test_trees_alone_and_batched_equal_speculation_off(target_model_dir, greedy_off, oracle):
    outputs, oracle.reference = greedy_off
    engine = make_engine(target_model_dir, max_num_seqs=8)  # the n-gram proposer too
    inputs = [_tree(engine, "t0", PROMPTS[0], max_tokens=40),
              request(engine, "c1", PROMPTS[1], max_tokens=40, k=4),  # a chain beside it
              request(engine, "p2", PROMPTS[2], max_tokens=40, k=0),  # plain decoding
              _tree(engine, "t3", PROMPTS[3], k=6, branches=3, max_tokens=40)]
    results = asyncio.run(run_all(engine, inputs))
    for p, (tokens, _, _) in zip(PROMPTS, results):
        assert tokens == outputs[p][:40], p
    tree_usage = results[0][2].usage
    assert tree_usage.accepted_tokens >= 20  # whole true branches were taken
    assert tree_usage.proposed_tokens > tree_usage.accepted_tokens
    assert tree_usage.branch_hits == tree_usage.steps - 1 or tree_usage.branch_hits > 5
    assert results[1][2].usage.branch_hits == 0  # a chain never leaves its first child
    # what the policy prices trees from: their steps apart from chains, per branching limit
    oracle_stats = engine.stats.method(NAME)
    assert oracle_stats.greedy.drafts == 0  # every oracle request allowed trees
    assert set(oracle_stats.trees) == {2, 3}
    two = oracle_stats.trees[2].greedy
    assert two.drafts > 0 and two.accepted_tokens >= 20 and two.drafted_at and two.accepted_at
    counts = oracle_stats.counts()
    assert counts.acceptance(True, 2).accepted == two.accepted_tokens
    assert counts.acceptance(True).accepted == 0 and counts.acceptance(True, 4).tried == 0
    assert engine.stats.method("ngram").greedy.drafts > 0 and not engine.stats.method(
        "ngram").trees
    assert drained(engine)


def check_a_tree_alone_equals_speculation_off(target_model_dir, greedy_off):
    outputs, OracleTree.reference = greedy_off
    engine = make_engine(target_model_dir, proposers={})
    ((tokens, _, last),) = asyncio.run(run_all(engine, [_tree(engine, "a", PROMPTS[1],
                                                              max_tokens=24)]))
    assert tokens == outputs[PROMPTS[1]][:24]
    assert last.usage.branch_hits > 0


def test_the_check_catches_keeping_the_first_branchs_rows(target_model_dir, greedy_off, oracle,
                                                           monkeypatch):
    check_a_tree_alone_equals_speculation_off(target_model_dir, greedy_off)
    bug.tree_keeps_first_rows(monkeypatch)
    with pytest.raises(AssertionError):
        check_a_tree_alone_equals_speculation_off(target_model_dir, greedy_off)


def test_trees_under_preemption_equal_speculation_off(target_model_dir, greedy_off, oracle):
    outputs, oracle.reference = greedy_off

    async def run():
        engine = make_engine(target_model_dir, proposers={}, max_num_seqs=8, block_size=4,
                             num_kv_blocks=40)
        engine.start()
        try:
            res = await asyncio.gather(*(collect(engine, _tree(engine, f"t{i}", p, max_tokens=40))
                                         for i, p in enumerate(PROMPTS[:4])))
            return res, engine
        finally:
            await engine.shutdown()

    res, engine = asyncio.run(run())
    assert engine.scheduler.num_preemptions > 0
    for p, (tokens, _, _) in zip(PROMPTS, res):
        assert tokens == outputs[p][:40]
    assert drained(engine)


def test_seeded_sampled_output_is_the_same_with_trees_on_and_off(target_model_dir, greedy_off,
                                                                 oracle):
    _, oracle.reference = greedy_off  # the tree is around the greedy path: partly accepted
    sampling = SamplingParams(temperature=0.8, seed=1234)
    engine = make_engine(target_model_dir, proposers={})
    off, on = asyncio.run(run_all(engine, [
        request(engine, "off", PROMPTS[0], max_tokens=32, k=0, sampling=sampling),
        _tree(engine, "on", PROMPTS[0], max_tokens=32, sampling=sampling)]))
    assert on[0] == off[0]
    assert drained(engine)


def test_a_proposer_tree_may_not_branch_more_than_the_step_allows():
    tree = Draft("s", [5, 6, 7], parents=[-1, -1, -1])
    assert tree.tree_error(8, 2) is not None and tree.tree_error(8, 3) is None
    assert Draft("s", [5, 6], parents=[-1, 0]).tree_error(8, 1) is None  # a chain always fits
    assert Draft("s", [5, 6], parents=[-1, 1]).tree_error(8, 2) is not None  # not topological
    assert Draft("s", [5, 6], parents=[-1]).tree_error(8, 2) is not None  # one parent short


# An in-target method owns its tree's shape (lookahead's window branches as it must); within its
# node budget only the structure is checked.
@pytest.mark.parametrize("mangle", [
    lambda d: Draft(d.seq_id, d.tokens, parents=[0] * len(d.tokens)),  # a node its own parent
    lambda d: Draft(d.seq_id, d.tokens + [1, 2], parents=d.parents + [-1, 0]),  # over budget
], ids=["self-parent", "too-many-nodes"])
def test_a_malformed_tree_costs_only_speculation(target_model_dir, greedy_off, oracle, mangle):
    outputs, oracle.reference = greedy_off
    oracle.mangle = mangle
    engine = make_engine(target_model_dir, proposers={})
    ((tokens, _, last),) = asyncio.run(run_all(engine, [_tree(engine, "m", PROMPTS[0],
                                                              max_tokens=16)]))
    assert tokens == outputs[PROMPTS[0]][:16]
    assert last.usage.proposed_tokens == 0  # every draft was refused, the request went on
    assert drained(engine)
