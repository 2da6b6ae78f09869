"""Structured outputs' pieces (verifier_service/grammar/): each verified row's mask is the
grammar's after that row's own prefix (chain row i after drafts[:i], a tree node after its own
path, never a sibling's), checked against a fresh xgrammar matcher per row; the masks reach the
step's hard mask; forbidden drafts are pruned with their subtrees; grammars compile once, are
cached within a bound, and a grammar that does not compile (or not in time) is InvalidArgument
naming its field. Each row check has a planted-bug control."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import planted_bugs as bug
import pytest
import torch
import xgrammar as xgr
from tiny_proposer_models import TINY_TARGET

from kernels.layout import StepLayout
from kernels.sparse_probs import SparseProbs
from kernels.token_bitmask import banned_from_bitmask
from splitspec.errors import InvalidArgument
from splitspec.params import SamplingParams, StructuredKind, StructuredOutput
from splitspec.proposal import Draft
from verifier_service.grammar.compiler import GrammarCompiler
from verifier_service.grammar.matcher import GrammarState
from verifier_service.grammar.prune import prune_draft
from verifier_service.methods.in_target import DeviceDraft
from verifier_service.step.sampling_state import SamplingState

V, EOS = 1024, 0
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
          "required": ["a", "b"]}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_TARGET)


@pytest.fixture(scope="module")
def compiler(tokenizer):
    c = GrammarCompiler(tokenizer, V, {EOS})
    yield c
    c.shutdown()


def _structured(kind: str, spec: str = "", choices=()) -> StructuredOutput:
    return StructuredOutput(StructuredKind(kind), spec, tuple(choices))


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _reference(compiled, committed, tokens, parents) -> torch.Tensor:
    """Each row's bitmask from a fresh matcher fed the row's whole prefix."""
    out = xgr.allocate_token_bitmask(len(tokens) + 1, V)
    for row, node in enumerate(range(-1, len(tokens))):
        m = xgr.GrammarMatcher(compiled)
        path = []
        while node >= 0:
            path.append(tokens[node])
            node = parents[node]
        for t in list(committed) + path[::-1]:
            assert m.accept_token(t)
        m.fill_next_token_bitmask(out, row)
    return out


def _rows(compiled, committed, tokens, parents) -> torch.Tensor:
    state = GrammarState(compiled, V)
    assert state.accept(committed)
    bitmask = torch.full((len(tokens) + 4, (V + 31) // 32), 7, dtype=torch.int32)
    state.fill_rows(tokens, parents, bitmask, 2)
    assert bitmask[:2].eq(7).all() and bitmask[-1].eq(7).all()  # its rows only
    return bitmask[2:2 + len(tokens) + 1]


def check_chain_rows_after_their_prefix(compiler, tokenizer) -> None:
    compiled = compiler.compile_now(_structured("json_schema", json.dumps(SCHEMA)))
    committed = _ids(tokenizer, '{"a":')
    tokens = _ids(tokenizer, '12,"b":"')
    parents = list(range(-1, len(tokens) - 1))
    got = _rows(compiled, committed, tokens, parents)
    assert torch.equal(got, _reference(compiled, committed, tokens, parents))


def check_tree_rows_after_their_own_path(compiler, tokenizer) -> None:
    compiled = compiler.compile_now(_structured("regex", "(ab|ba)c"))
    a, b, c = (_ids(tokenizer, ch)[0] for ch in "abc")
    # root -> a (0) -> b (2) -> c (4); root -> b (1) -> a (3)
    tokens, parents = [a, b, b, a, c], [-1, -1, 0, 1, 2]
    got = _rows(compiled, [], tokens, parents)
    assert torch.equal(got, _reference(compiled, [], tokens, parents))


@pytest.mark.parametrize("plant, check", [
    (None, check_chain_rows_after_their_prefix),
    (None, check_tree_rows_after_their_own_path),
    (bug.grammar_mask_one_row_late, check_chain_rows_after_their_prefix),
    (bug.grammar_node_masked_with_its_siblings_state, check_tree_rows_after_their_own_path),
], ids=["chain", "tree", "control-one-row-late", "control-sibling-state"])
def test_rows_are_masked_after_their_own_prefix(compiler, tokenizer, monkeypatch, plant, check):
    if plant is None:
        check(compiler, tokenizer)
        return
    plant(monkeypatch)
    with pytest.raises(AssertionError):
        check(compiler, tokenizer)


def test_a_complete_structure_allows_only_a_stop_token_and_nothing_after_it(compiler,
                                                                            tokenizer):
    compiled = compiler.compile_now(_structured("choice", choices=("yes", "no")))
    state = GrammarState(compiled, V)
    yes = _ids(tokenizer, "yes")
    x = _ids(tokenizer, "x")[0]
    tokens, parents = [*yes, EOS, x], list(range(-1, len(yes) + 1))
    bitmask = torch.zeros(len(tokens) + 1, (V + 31) // 32, dtype=torch.int32)
    state.fill_rows(tokens, parents, bitmask, 0)
    allowed = ~banned_from_bitmask(bitmask, V)
    assert allowed[len(yes)].nonzero().flatten().tolist() == [EOS]  # after "yes": EOS only
    assert allowed[len(yes) + 1].nonzero().flatten().tolist() == [EOS]  # after EOS: no NaN row
    assert state.kept_nodes(tokens, parents) == list(range(len(yes) + 1))  # x goes
    # a step's tokens are kept up to the one that completes it (a bonus EOS after it is not)
    assert state.complete_within([*yes, EOS, EOS]) == len(yes) + 1
    assert state.complete_within(yes) == len(yes)
    assert not state.terminated  # the walks moved nothing
    assert state.accept([*yes, EOS]) and state.terminated


def test_forbidden_drafts_are_pruned_with_their_subtrees(compiler, tokenizer):
    compiled = compiler.compile_now(_structured("regex", "(ab|ba)c"))
    a, b, c = (_ids(tokenizer, ch)[0] for ch in "abc")
    # root -> a (0) -> a (2, forbidden) -> c (4); root -> b (1) -> a (3) -> c (5)
    tokens, parents = [a, b, a, a, c, c], [-1, -1, 0, 1, 2, 3]
    q = SparseProbs.from_rows([([t], [1.0]) for t in tokens])
    q.probs[:, 0] = torch.arange(6, dtype=torch.float32)  # tells the rows apart
    state = GrammarState(compiled, V)
    pruned, n = prune_draft(Draft("s", tokens, q, parents=parents), state)
    assert n == 2
    assert pruned.tokens == [a, b, a, c] and pruned.parents == [-1, -1, 1, 2]
    assert pruned.q.probs[:, 0].tolist() == [0.0, 1.0, 3.0, 5.0]
    # a head's q drawn on the device stays one (the step checks it there)
    held = DeviceDraft("s", list(tokens), parents=list(parents), device_q=q)
    pruned_held, _ = prune_draft(held, state)
    assert isinstance(pruned_held, DeviceDraft) and pruned_held.q is None
    assert pruned_held.device_q.probs[:, 0].tolist() == [0.0, 1.0, 3.0, 5.0]
    chain = Draft("s", [a, b, c])
    assert prune_draft(chain, state) == (chain, 0)  # nothing forbidden: the same draft
    assert prune_draft(Draft("s", [c, a]), state) == (None, 2)


def test_bitmask_kernel_equals_xgrammar(compiler):
    torch.manual_seed(0)
    vocab = 1000  # not a multiple of 32
    bitmask = torch.randint(-2**31, 2**31 - 1, (5, (vocab + 31) // 32), dtype=torch.int32)
    logits = torch.randn(5, vocab)
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, bitmask, vocab_size=vocab)
    got = logits.masked_fill(banned_from_bitmask(bitmask, vocab), float("-inf"))
    assert torch.equal(got, want)


def test_the_step_hard_mask_carries_each_rows_grammar(compiler, tokenizer):
    compiled = compiler.compile_now(_structured("regex", "(ab|ba)c"))
    a, b, c = (_ids(tokenizer, ch)[0] for ch in "abc")
    structured = SamplingParams(temperature=0.0, structured=_structured("regex", "(ab|ba)c"))
    seq = SimpleNamespace(request_id="g", inp=SimpleNamespace(sampling=structured,
                                                              prompt_token_ids=(5, 6)),
                          tokens=[5, 6], finished=False, bad_words_ids=(),
                          tracker=SimpleNamespace(stop_token_ids=frozenset({EOS})),
                          grammar=GrammarState(compiled, V))
    plain = SimpleNamespace(request_id="p", inp=SimpleNamespace(
        sampling=SamplingParams(temperature=0.0, allowed_token_ids=(a, b)),
        prompt_token_ids=(5,)), tokens=[5], finished=False, bad_words_ids=(),
        tracker=SimpleNamespace(stop_token_ids=frozenset({EOS})))
    drafts = [Draft("g", [a, b, b, a], parents=[-1, -1, 0, 1]), Draft("p", [a])]
    layout = StepLayout.build([5, 2], [1, 0], [4, 1], [True, True],
                              [[-1, -1, 0, 1], None])
    step = SamplingState(V, torch.device("cpu")).step([seq, plain], drafts, layout)
    hard = step.processors.hard
    want = banned_from_bitmask(_reference(compiled, [], [a, b, b, a], [-1, -1, 0, 1]), V)
    assert torch.equal(hard[:5], want)
    assert hard[5:].sum(-1).tolist() == [V - 2, V - 2]  # the other request's own mask only
    assert (~hard[3]).nonzero().flatten().tolist() == [c]  # after "ab": c


# -- compiling ------------------------------------------------------------------------------------

def test_a_grammar_compiles_once_and_the_cache_is_bounded(tokenizer):
    c = GrammarCompiler(tokenizer, V, {EOS}, cache_size=2)
    try:
        first = _structured("regex", "[a-c]+")
        got = [c.compile_now(first) for _ in range(3)]
        got.append(asyncio.run(c.compile(first)))
        assert c.compiled == 1 and all(g is got[0] for g in got)
        assert c.hits == 3 and c.compile_seconds > 0  # what /metrics reports
        for spec in ("x+", "y+", "z+"):
            c.compile_now(_structured("regex", spec))
        assert c.cached == 2 and c.compiled == 4
        c.compile_now(first)  # evicted: compiled again
        assert c.compiled == 5 and c.hits == 3
    finally:
        c.shutdown()


@pytest.mark.parametrize("structured, field", [
    (_structured("regex", "[a-"), "structured_outputs.regex"),
    (_structured("json_schema", '{"type": "nope"}'), "response_format.json_schema"),
    (_structured("grammar", 'root ::= "a" | '), "structured_outputs.grammar"),
])
def test_a_grammar_that_does_not_compile_names_its_field(compiler, structured, field):
    for compile_it in (compiler.compile_now, lambda s: asyncio.run(compiler.compile(s))):
        with pytest.raises(InvalidArgument) as err:
            compile_it(structured)
        assert err.value.field == field and "does not compile" in str(err.value)
        assert "/project/" not in str(err.value)  # xgrammar's source path left out
    assert compiler.compile_now(_structured("regex", "ok")) is not None  # still compiling


def test_a_grammar_past_its_time_limit_is_refused(tokenizer, monkeypatch):
    c = GrammarCompiler(tokenizer, V, {EOS}, timeout_s=0.05)
    real = c._compile
    monkeypatch.setattr(c, "_compile", lambda s: (time.sleep(0.5), real(s))[1])
    try:
        slow = _structured("json_schema", json.dumps(SCHEMA))
        with pytest.raises(InvalidArgument, match="did not compile within") as err:
            asyncio.run(c.compile(slow))
        assert err.value.field == "response_format.json_schema"
        with pytest.raises(InvalidArgument, match="did not compile within"):
            c.compile_now(_structured("regex", "a+"))
    finally:
        c.shutdown()
