"""The draft model's tree: its chain with the draft's likeliest other tokens as leaves beside each
chain node (up to max_branch - 1, in the draft's rank order), cut to the node budget by
cumulative draft probability; a chain step unchanged."""

from __future__ import annotations

import pytest
import torch

from kernels.sparse_probs import SparseProbs
from kernels.tree_rejection import tree_rejection_sample
from proposer_service.draft.branches import branch_chain
from proposer_service.draft.proposer import DraftModelProposer
from splitspec.params import SamplingParams
from splitspec.proposal import Draft, SequenceStep

CPU = torch.device("cpu")


def test_unsure_positions_branch_and_a_confident_chain_runs_deep():
    chain = Draft("s", [10, 11, 12])
    alternatives = [([10, 20], [0.5, 0.4]), ([11, 21], [0.9, 0.05]), ([12, 22], [0.6, 0.3])]
    # scores: 10: .5, 20: .4, 11: .45, 21: .025, 12: .27, 22: .135
    tree = branch_chain(chain, alternatives, budget=4, max_branch=2)
    assert tree.tokens == [10, 11, 20, 12] and tree.parents == [-1, 0, -1, 1] and tree.q is None
    assert branch_chain(chain, alternatives, 6, 2).tokens == [10, 11, 20, 12, 22, 21]
    # no branching: the chain itself
    one = branch_chain(chain, alternatives, 3, 1)
    assert one.tokens == [10, 11, 12] and one.parents == [-1, 0, 1]


def test_a_wider_branching_adds_the_next_likeliest_tokens_in_rank_order():
    chain = Draft("s", [10, 11])
    alternatives = [([10, 20, 30, 40], [0.4, 0.3, 0.2, 0.1]),
                    ([11, 21, 31, 41], [0.5, 0.3, 0.1, 0.1])]
    # scores: 10 .4, 20 .3, 30 .2, 11 .2, 21 .12, 31 .04
    tree = branch_chain(chain, alternatives, budget=5, max_branch=3)
    assert tree.tokens == [10, 20, 30, 11, 21] and tree.parents == [-1, -1, -1, 0, 0]
    wide = branch_chain(chain, alternatives, budget=8, max_branch=4)  # three leaves a node
    assert sorted(p for p in wide.parents if p == -1) == [-1] * 4


def test_a_sampled_chain_node_precedes_its_deterministic_leaf():
    # the sampled token 30 is not among the draft's two likeliest: its leaf is the likeliest
    q = SparseProbs.from_rows([([30, 10], [0.3, 0.7]), ([11], [1.0])])
    chain = Draft("s", [30, 11], q)
    alternatives = [([10, 20], [0.6, 0.2]), ([11, 21], [0.7, 0.2])]
    tree = branch_chain(chain, alternatives, budget=4, max_branch=2)
    # 10 scores .6 alone, above the sampled 30 (.3): capped, it still comes after 30
    assert tree.tokens == [30, 10, 11, 21] and tree.parents == [-1, -1, 0, 0]
    rows = tree.q.rows()
    assert rows[0] == ([30, 10], pytest.approx([0.3, 0.7])) and rows[1] == ([10], [1.0])
    assert rows[2] == ([11], [1.0]) and rows[3] == ([21], [1.0])


@pytest.fixture(scope="module")
def proposer(noisy_draft_dir):
    torch.set_num_threads(1)
    return DraftModelProposer.load(noisy_draft_dir, CPU, torch.float32, draft_top_k=16)


@torch.inference_mode()
def top2(model, ids: list[int]) -> list[int]:
    return model(input_ids=torch.tensor([ids])).logits[0, -1].topk(2).indices.tolist()


def test_a_branching_step_adds_the_drafts_second_guesses_and_a_chain_step_is_unchanged(proposer):
    prompt = [5, 17, 33, 2, 9, 41, 7]
    step = SequenceStep("s", prompt, len(prompt), 4, full_history=True)
    (chain,) = proposer.open_session().propose([step])
    (one,) = proposer.open_session().propose([SequenceStep("s", prompt, len(prompt), 4,
                                                           full_history=True, max_branch=1)])
    assert (one.tokens, one.parents, one.q) == (chain.tokens, chain.parents, None)
    (tree,) = proposer.open_session().propose([SequenceStep("s", prompt, len(prompt), 4,
                                                            full_history=True, max_branch=2)])
    assert len(tree.tokens) == 4 and tree.q is None
    assert len(set(tree.parents)) < 4  # this draft is unsure somewhere: the tree branches
    for i, p in enumerate(tree.parents):
        assert -1 <= p < i
        path = [tree.tokens[a] for a in _ancestors(tree.parents, i)]
        # every node is the draft's best or second-best token after its own path
        assert tree.tokens[i] in top2(proposer.model, prompt + path)


def test_the_leaves_a_tree_keeps_grow_chains_of_their_own(proposer):
    """EAGLE-2's expansion one level down: a kept leaf is drafted on (one more batched pass over
    the shared cache), and its chain competes for the budget like any node."""
    prompt = [5, 17, 33, 2, 9, 41, 7]
    (tree,) = proposer.open_session().propose([SequenceStep("s", prompt, len(prompt), 8,
                                                            full_history=True, max_branch=2)])
    first = {}
    for i, p in enumerate(tree.parents):
        first.setdefault(p, i)
    leaves = {i for i, p in enumerate(tree.parents) if first[p] != i}
    grown = [i for i, p in enumerate(tree.parents) if p in leaves]
    assert leaves and grown, (tree.tokens, tree.parents)
    for i in grown:  # greedy: the draft's best token after the leaf's path
        path = [tree.tokens[a] for a in _ancestors(tree.parents, i)]
        assert tree.tokens[i] == top2(proposer.model, prompt + path)[0]


def test_sampled_branching_steps_send_one_q_row_per_node(proposer):
    prompt = [5, 17, 33, 2, 9, 41, 7]
    sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=4)
    (tree,) = proposer.open_session().propose([SequenceStep(
        "s", prompt, len(prompt), 5, full_history=True, sampling=sampled, max_branch=2)])
    rows = tree.q.rows()
    assert len(rows) == len(tree.tokens) == len(tree.parents) == 5
    for token, (ids, probs) in zip(tree.tokens, rows):
        assert token in ids and sum(probs) == pytest.approx(1.0, abs=1e-4)
    # siblings: the sampled chain node (a real q) first, then its one-hot leaf
    for i, p in enumerate(tree.parents):
        later = [j for j in range(i + 1, 5) if tree.parents[j] == p]
        if later:
            assert len(later) == 1 and rows[later[0]][1] == [1.0]


def _ancestors(parents: list[int], node: int) -> list[int]:
    out = []
    while parents[node] >= 0:
        node = parents[node]
        out.insert(0, node)
    return out


def test_a_grown_leaf_s_chain_hangs_under_it_scored_by_its_path():
    chain = Draft("s", [10, 11])
    alternatives = [([10, 20], [0.5, 0.4]), ([11, 21], [0.9, 0.05])]
    grown = {(0, 20): (Draft("s", [30, 31]), [([30, 32], [0.8, 0.1]), ([31, 33], [0.5, 0.2])])}
    # scores: 10 .5, 20 .4, 11 .45, 30 .32, 31 .16, 21 .025
    tree = branch_chain(chain, alternatives, budget=5, max_branch=2, subtrees=grown)
    assert tree.tokens == [10, 11, 20, 30, 31] and tree.parents == [-1, 0, -1, 2, 3]
    assert tree.q is None
    q = SparseProbs.from_rows([([30, 32], [0.8, 0.2]), ([31], [1.0])])
    sampled = {(0, 20): (Draft("s", [30, 31], q), grown[(0, 20)][1])}
    tree = branch_chain(Draft("s", [10, 11], SparseProbs.from_rows([([10], [1.0]), ([11], [1.0])])),
                        alternatives, budget=5, max_branch=2, subtrees=sampled)
    assert tree.q.rows()[3] == ([30, 32], pytest.approx([0.8, 0.2]))  # sent with its own q


def test_the_tree_sampler_takes_these_trees_and_a_second_guess_is_accepted():
    chain = Draft("s", [10, 11, 12])
    alternatives = [([10, 20], [0.5, 0.4]), ([11, 21], [0.9, 0.05]), ([12, 22], [0.6, 0.3])]
    tree = branch_chain(chain, alternatives, budget=4, max_branch=2)  # 10, 11, 20, 12
    # the target wants 20 first, then 7: a chain would have nothing accepted
    want = {-1: 20, tree.tokens.index(20): 7}
    rows = torch.zeros(len(tree.tokens) + 1, 32)  # row r + 1: after node r
    for r in range(-1, len(tree.tokens)):
        rows[r + 1, want.get(r, 0)] = 1.0
    res = tree_rejection_sample(rows, torch.tensor(tree.tokens), [tree.parents],
                                torch.tensor([len(tree.tokens)]), None, [True])
    assert res.paths() == [[tree.tokens.index(20)]] and res.tokens() == [[20, 7]]
    # a sampled tree: its q rows (sampled chain nodes, one-hot leaves) fit the sampler too
    q = SparseProbs.from_rows([([10, 20], [0.6, 0.4]), ([11, 21], [0.9, 0.1]),
                               ([12, 22], [0.7, 0.3])])
    tree = branch_chain(Draft("s", [10, 11, 12], q), alternatives, budget=5, max_branch=2)
    res = tree_rejection_sample(torch.softmax(torch.randn(6, 32), -1), torch.tensor(tree.tokens),
                                [tree.parents], torch.tensor([5]), tree.q, [False])
    assert len(res.tokens()[0]) == res.num_accepted.item() + 1
