"""The step's sampling state (verifier_service/step/sampling_state.py): every verified row is
processed with its own history (chain row i: the committed output plus drafts[:i]; a tree node:
the path from the root to it, never a sibling), min_tokens counts output tokens only, bad words
ban their last token after their prefix, and slots come and go with their sequences. Each check
has a planted-bug control."""

from __future__ import annotations

from types import SimpleNamespace

import planted_bugs as bug
import pytest
import torch

from kernels.layout import StepLayout
from splitspec.params import SamplingParams
from splitspec.proposal import Draft
from verifier_service.step.sampling_state import SamplingState, bad_word_ids

V = 40
PROMPT = (30, 31, 32, 33, 34)
EOS = 39


def _seq(rid: str, output: list[int], words=(), **sampling):
    p = SamplingParams(temperature=0.0, **sampling)
    return SimpleNamespace(request_id=rid, inp=SimpleNamespace(sampling=p, prompt_token_ids=PROMPT),
                           tokens=list(PROMPT) + output, finished=False,
                           tracker=SimpleNamespace(stop_token_ids=frozenset({EOS})),
                           bad_words_ids=words)


def _step(state, seqs, drafts):
    ks = [len(d.tokens) if d else 0 for d in drafts]
    trees = [None if d is None or d.is_chain else d.parents for d in drafts]
    layout = StepLayout.build([k + 1 for k in ks], [len(s.tokens) - 1 for s in seqs], ks,
                              [True] * len(seqs), trees if any(trees) else None)
    return state.step(seqs, drafts, layout)


def _counts(step) -> list[dict[int, int]]:
    c = step.processors.counts
    return [{t: int(c[r, t]) for t in c[r].nonzero().flatten().tolist()} for r in range(len(c))]


def check_chain_rows_count_the_drafts_before_them() -> None:
    state = SamplingState(V, torch.device("cpu"))
    seq = _seq("a", [1, 2], frequency_penalty=1.0, repetition_penalty=1.2)
    step = _step(state, [seq], [Draft("a", [3, 1, 4])])
    assert step.processors.rows.tolist() == [0, 1, 2, 3]
    assert _counts(step) == [{1: 1, 2: 1}, {1: 1, 2: 1, 3: 1}, {1: 2, 2: 1, 3: 1},
                             {1: 2, 2: 1, 3: 1, 4: 1}]
    # the prompt is seen (repetition penalty), not counted
    assert bool(step.processors.seen[0, 30]) and not bool(step.processors.seen[0, 5])


def check_tree_nodes_count_their_path_only() -> None:
    state = SamplingState(V, torch.device("cpu"))
    seq = _seq("t", [7], presence_penalty=0.5)
    # root -> 10 (node 0) -> 12 (node 2); root -> 11 (node 1) -> 13 (node 3)
    tree = Draft("t", [10, 11, 12, 13], parents=[-1, -1, 0, 1])
    step = _step(state, [seq], [tree])
    assert _counts(step) == [{7: 1}, {7: 1, 10: 1}, {7: 1, 11: 1}, {7: 1, 10: 1, 12: 1},
                             {7: 1, 11: 1, 13: 1}]


def check_min_tokens_counts_output_tokens() -> None:
    state = SamplingState(V, torch.device("cpu"))
    seq = _seq("m", [1, 2], min_tokens=4)  # 2 generated: rows picking tokens 3 and 4 ban EOS
    step = _step(state, [seq], [Draft("m", [5, 6, 7])])
    soft = step.processors.soft
    assert soft is not None, "no row bans EOS"
    assert [bool(soft[r, EOS]) for r in range(4)] == [True, True, False, False]


@pytest.mark.parametrize("plant, check", [
    (None, check_chain_rows_count_the_drafts_before_them),
    (None, check_tree_nodes_count_their_path_only),
    (None, check_min_tokens_counts_output_tokens),
    (bug.penalty_counts_leave_out_earlier_drafts, check_chain_rows_count_the_drafts_before_them),
    (bug.tree_node_counts_its_siblings, check_tree_nodes_count_their_path_only),
    (bug.min_tokens_counted_from_the_prompt, check_min_tokens_counts_output_tokens),
], ids=["chain", "tree", "min-tokens", "control-chain-without-earlier-drafts",
        "control-tree-node-with-siblings", "control-min-tokens-from-prompt"])
def test_rows_see_their_own_history(monkeypatch, plant, check):
    if plant is None:
        check()
        return
    plant(monkeypatch)
    with pytest.raises(AssertionError):
        check()


def test_multi_token_bad_words_ban_their_last_token_after_their_prefix():
    state = SamplingState(V, torch.device("cpu"))
    seq = _seq("b", [8, 9], words=((9, 3), (5,)), bad_words=("x",))
    step = _step(state, [seq], [Draft("b", [3, 9])])
    soft = step.processors.soft
    # single-token word 5 banned everywhere; 3 banned right after a 9 (rows 0 and 2)
    assert soft[:, 5].tolist() == [True, True, True]
    assert soft[:, 3].tolist() == [True, False, True]


def test_bad_words_are_tokenized_alone_and_after_a_space():
    table = {"foo": [1, 2], " foo": [3]}
    assert bad_word_ids(["foo"], lambda text: table[text]) == ((1, 2), (3,))


def test_emitted_tokens_update_the_counts_and_slots_are_reused():
    state = SamplingState(V, torch.device("cpu"), capacity=1)
    a = _seq("a", [], frequency_penalty=1.0, logit_bias=((4, 2.0),))
    plain = _seq("p", [])
    step = _step(state, [a, plain], [None, None])
    assert step.processors.rows.tolist() == [0]  # the plain sequence's row is not processed
    state.emitted(a, [6, 6])
    assert _counts(_step(state, [a], [None])) == [{6: 2}]
    assert state.num_processing == 1
    state.leave(a)
    state.leave(plain)
    assert state.num_processing == 0
    b = _seq("b", [], presence_penalty=1.5)
    step = _step(state, [b], [None])
    assert _counts(step) == [{}] and step.processors.bias is None  # a reused row starts clean
    assert step.processors.seen is None  # no repetition penalty: that stage reads nothing
