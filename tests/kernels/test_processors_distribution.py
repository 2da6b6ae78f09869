"""Sampled output with logits processors on is distributed as the processed target, at every
drafted chain position and tree node, the bonus included (soak tier: Pearson's chi-square over
thousands of copies, with its power check).

The pipeline is the verifier's: the step's sampling state (verifier_service/step/
sampling_state.py) builds each row's processors from its own history, the rows are processed
and shaped (temperature), and the tree sampler verifies the drafts. The oracle here is
independent of it: among copies that accepted j nodes, the (j + 1)-th token must follow the
Markov target's row after token j, processed with OpenAI's penalties over the copy's committed
output plus the tokens it actually emitted before it. A sampler whose rows count their
siblings' tokens, or leave out the drafts before them, draws from another p and fails."""

from __future__ import annotations

from types import SimpleNamespace

import planted_bugs as bug
import pytest
import torch
from test_tree_rejection import SHAPES, chi_square_pvalue, draw_trees, markov, max_depth

from kernels import StepLayout, tree_rejection_sample
from kernels.logits_processors import ProcessorRows, process_rows
from splitspec.params import SamplingParams, StructuredOutput
from splitspec.proposal import Draft
from verifier_service.step.sampling_state import SamplingState

V, ROOT, N = 6, 0, 3_000  # vocab, the root's token, copies per kind (unseeded, seeded)
PROMPT, OUTPUT = (4, 5), [ROOT, 1, 1]  # the committed history every copy starts from
FIELDS = dict(frequency_penalty=1.5, presence_penalty=0.7, repetition_penalty=1.4,
              logit_bias=((3, 1.0),))
FAMILY_ALPHA = 1e-4


def _seq(i: int, seed):
    p = SamplingParams(temperature=1.0, seed=seed, **FIELDS)
    return SimpleNamespace(request_id=f"c{i}", inp=SimpleNamespace(sampling=p,
                                                                   prompt_token_ids=PROMPT),
                           tokens=list(PROMPT) + OUTPUT, finished=False, bad_words_ids=(),
                           tracker=SimpleNamespace(stop_token_ids=frozenset()))


def _oracle_row(raw_row: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """The processed target after `history` [n, L] (emitted tokens): probabilities [n, V]."""
    n = history.shape[0]
    counts = torch.zeros(n, V)
    counts += torch.bincount(torch.tensor(OUTPUT), minlength=V).float()
    counts.scatter_add_(1, history, torch.ones_like(history, dtype=torch.float32))
    seen = counts > 0
    seen[:, list(PROMPT)] = True
    bias = torch.zeros(n, V)
    bias[:, 3] = 1.0
    col = lambda v: torch.full((n, 1), v)  # noqa: E731
    x = process_rows(raw_row.log(), ProcessorRows(torch.arange(n), counts, seen, col(1.4),
                                                  col(1.5), col(0.7), bias, None, None))
    return x.softmax(-1)


def check_processed_distribution(name: str) -> None:
    seed = 31 + len(name)
    p, q = markov(seed, max_depth(SHAPES[name]))
    out, n_acc = _sampled(name, seed, p, q, _seq, len(OUTPUT))
    checks = []
    for j in range(out.shape[1]):
        reached = n_acc >= j
        if int(reached.sum()) < 200:
            continue
        prev = out[reached, j - 1] if j else torch.full((int(reached.sum()),), ROOT)
        expected = _oracle_row(p[j, prev], out[reached, :j]).double().sum(0)
        checks.append((j, torch.bincount(out[reached, j], minlength=V).double(), expected))
    _assert_fits(name, checks)


def _sampled(name: str, seed: int, p, q, make_seq, output_len: int):
    """2N copies (odd ones seeded) of the shape's tree drawn from q over target p, each copy a
    sequence make_seq(i, seed) with output_len tokens committed, through the step's sampling
    state and the tree sampler: emitted tokens [2N, depth + 1] and accepted counts."""
    shape = SHAPES[name]
    gen = torch.Generator().manual_seed(seed)
    b, m = 2 * N, len(shape)
    tokens, qs, rows = draw_trees(shape, p, q, b, gen)
    parents = [par for par, _ in shape]
    seqs = [make_seq(i, i if i % 2 else None) for i in range(b)]
    drafts = [Draft(s.request_id, tokens[i].tolist(), parents=list(parents))
              for i, s in enumerate(seqs)]
    layout = StepLayout.build([m + 1] * b, [len(PROMPT) + output_len - 1] * b, [m] * b,
                              [True] * b, [list(parents)] * b)
    step = SamplingState(V, torch.device("cpu")).step(seqs, drafts, layout)
    probs = step.row_tensors().apply(step.process(rows.reshape(-1, V).log()))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        res = tree_rejection_sample(probs, tokens.reshape(-1), [parents] * b, layout, qs.reshape(
            b * m, V), step.greedy, step.seeds)
    return res.output_token_ids, res.num_accepted


def _assert_fits(name: str, checks) -> None:
    """Each (position, observed, expected counts) passes Pearson's test at the family's level."""
    assert len(checks) >= 2, checks
    for j, obs, exp in checks:
        pval = chi_square_pvalue(obs, exp)
        assert pval > FAMILY_ALPHA / len(checks), (name, j, pval, obs.tolist(), exp.tolist())


@pytest.mark.soak
@pytest.mark.parametrize("name", ["chain", "two-level-wor", "mixed", "star-det"])
def test_processed_rows_are_distributed_as_the_processed_target(name):
    check_processed_distribution(name)


@pytest.mark.soak
@pytest.mark.parametrize("plant, name", [
    (bug.tree_node_counts_its_siblings, "two-level-wor"),
    (bug.penalty_counts_leave_out_earlier_drafts, "chain"),
], ids=["siblings-counted", "earlier-drafts-left-out"])
def test_the_chi_square_catches_rows_with_another_history(monkeypatch, plant, name):
    plant(monkeypatch)
    with pytest.raises(AssertionError):
        check_processed_distribution(name)


# ---- the grammar's mask at drafted positions ----
# tokens a, b, c, d, e and the stop token; after each letter the grammar allows two others or
# the end (e never), which two depending on the letter and on whether the output so far is of
# even or odd length: a row masked with another path's state (a sibling's, its parent's) draws
# from another distribution
LETTERS, STOP = "abcde", 5
NEXT = ({"a": "bc", "b": "ad", "c": "ab", "d": "ca"},  # after an even number of letters
        {"a": "ad", "b": "bc", "c": "cd", "d": "db"})  # after an odd number
GRAMMAR = "\n".join(
    ["root ::= " + " | ".join(f'"{y}" {y.upper()}1' for y in "abcd")]
    + [f"{x.upper()}{odd} ::= (" + " | ".join(f'"{y}" {y.upper()}{1 - odd}' for y in nxt)
       + ")?" for odd in (0, 1) for x, nxt in NEXT[odd].items()])
GRAMMAR_OUTPUT = [0, 3]  # "ad" committed: the last token d (id 3), an even length


def _allowed(prev: int, length: int) -> list[int]:
    """What the grammar allows after `length` output tokens, the last `prev`."""
    if prev == STOP:  # the structure is complete: only a stop token may follow
        return [STOP]
    return [LETTERS.index(y) for y in NEXT[length % 2][LETTERS[prev]]] + [STOP]


def _grammar_seq(i: int, compiled, seed):
    from verifier_service.grammar.matcher import GrammarState

    state = GrammarState(compiled, V)
    assert state.accept(GRAMMAR_OUTPUT)
    p = SamplingParams(temperature=1.0, seed=seed,
                       structured=StructuredOutput("grammar", GRAMMAR))
    return SimpleNamespace(request_id=f"g{i}", inp=SimpleNamespace(sampling=p,
                                                                   prompt_token_ids=PROMPT),
                           tokens=list(PROMPT) + GRAMMAR_OUTPUT, finished=False,
                           bad_words_ids=(), grammar=state,
                           tracker=SimpleNamespace(stop_token_ids=frozenset()))


def check_masked_distribution(name: str) -> None:
    """Among copies that accepted j nodes, token j + 1 follows the Markov target's row after
    token j restricted to what the grammar allows after token j, renormalised."""
    xgr = pytest.importorskip("xgrammar")
    info = xgr.TokenizerInfo(list(LETTERS) + ["</s>"], vocab_size=V, stop_token_ids=[STOP])
    compiled = xgr.GrammarCompiler(info).compile_grammar(GRAMMAR)
    seed = 57 + len(name)
    p, q = markov(seed, max_depth(SHAPES[name]))
    root = GRAMMAR_OUTPUT[-1]
    p[0, ROOT] = p[0, root]  # draw_trees starts every tree from ROOT's row: the root's here
    out, n_acc = _sampled(name, seed, p, q, lambda i, s: _grammar_seq(i, compiled, s),
                          len(GRAMMAR_OUTPUT))
    checks = []
    for j in range(out.shape[1]):
        reached = n_acc >= j
        if int(reached.sum()) < 200:
            continue
        prev = out[reached, j - 1] if j else torch.full((int(reached.sum()),), root)
        expected = torch.zeros(V, dtype=torch.float64)
        for t in prev.unique().tolist():
            allowed = torch.zeros(V, dtype=torch.bool)
            allowed[_allowed(t, len(GRAMMAR_OUTPUT) + j)] = True
            row = torch.where(allowed, p[j, t if j else ROOT].double(), 0.0)
            expected += int((prev == t).sum()) * row / row.sum()
        checks.append((j, torch.bincount(out[reached, j], minlength=V).double(), expected))
    _assert_fits(name, checks)


@pytest.mark.soak
@pytest.mark.parametrize("name", ["chain", "two-level-wor"])
def test_masked_rows_are_distributed_as_the_masked_target(name):
    check_masked_distribution(name)


@pytest.mark.soak
@pytest.mark.parametrize("plant, name", [
    (bug.grammar_node_masked_with_its_siblings_state, "two-level-wor"),
    (bug.grammar_mask_one_row_late, "chain"),
], ids=["sibling-state", "one-row-late"])
def test_the_chi_square_catches_masks_of_another_path(monkeypatch, plant, name):
    plant(monkeypatch)
    with pytest.raises(AssertionError):
        check_masked_distribution(name)
