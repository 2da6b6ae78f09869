"""The tree sampler (kernels/tree_rejection.py): its output distribution equals the target's at
every depth, the bonus included, for several tree shapes in mixed batches (chi-square); greedy
and seeded rows against per-row oracles; paths and kept rows of hand-made trees; a chain gives
exactly the chain sampler's result; malformed trees are refused.

Distribution tests use a Markov target: the row after a token t at depth j is P[j, t] (the root's
is P[0, ROOT]), so among runs that accepted j nodes the (j + 1)-th emitted token must follow
P[j, token j]. Each check is Pearson's chi-square; a test's checks share a false-failure rate of
FAMILY_ALPHA (Bonferroni), and all seeds are fixed.
"""

from __future__ import annotations

import random

import pytest
import torch
from kernels_testlib import random_batch

from kernels import SparseProbs, StepLayout, rejection_sample, tree_rejection_sample
from kernels.sampling import keyed_argmax, noise_key

V, ROOT, N = 6, 0, 6_000  # vocab, the root's token, copies per row kind
FAMILY_ALPHA = 1e-4  # per test: probability that a correct sampler fails any of its checks

# shapes: per node (parent, how): ("det", token) fixed, "iid" drawn from Q[depth - 1, parent
# token], "wor" drawn like iid but without replacement among its earlier "wor" siblings
SHAPES = {
    "chain": [(-1, "iid"), (0, "iid"), (1, "iid")],
    "star-det": [(-1, ("det", 1)), (-1, ("det", 2)), (-1, ("det", 3))],
    "two-level-iid": [(-1, "iid"), (-1, "iid"), (0, "iid"), (0, "iid"), (1, "iid")],
    "two-level-wor": [(-1, "wor"), (-1, "wor"), (-1, "wor"), (0, "wor"), (0, "wor"), (1, "iid")],
    "mixed": [(-1, ("det", 2)), (-1, "iid"), (0, ("det", 4)), (1, "iid"), (1, ("det", 5))],
}


def markov(seed: int, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Target P [depth + 1, V, V] and draft Q [depth, V, V] (Q near P: realistic acceptance)."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(depth + 1, V, V, generator=gen, dtype=torch.float64), -1)
    noise = torch.softmax(torch.randn(depth, V, V, generator=gen, dtype=torch.float64), -1)
    return p.float(), (0.5 * p[1:] + 0.5 * noise).float()


def draw_trees(shape, p, q, n: int, gen: torch.Generator):
    """n copies of the shape's tree: tokens [n, M], per-node q [n, M, V] (the distribution each
    node was drawn from), target rows [n, M + 1, V]."""
    m = len(shape)
    tokens = torch.zeros(n, m, dtype=torch.long)
    qs = torch.zeros(n, m, V)
    rows = torch.zeros(n, m + 1, V)
    rows[:, 0] = p[0, ROOT]
    depth = []
    for d, (parent, how) in enumerate(shape):
        depth.append(1 if parent < 0 else depth[parent] + 1)
        parent_tok = tokens[:, parent] if parent >= 0 else torch.full((n,), ROOT)
        if isinstance(how, tuple):  # deterministic: one-hot at its token
            tokens[:, d] = how[1]
            qs[:, d] = torch.nn.functional.one_hot(tokens[:, d], V).float()
        else:
            dist = q[depth[d] - 1, parent_tok].clone()  # [n, V]
            if how == "wor":
                for e in range(d):
                    if shape[e][0] == parent and shape[e][1] == "wor":
                        dist.scatter_(1, tokens[:, e:e + 1], 0.0)
                dist /= dist.sum(-1, keepdim=True)
            qs[:, d] = dist
            tokens[:, d] = torch.multinomial(dist, 1, generator=gen).squeeze(1)
        rows[:, d + 1] = p[depth[d], tokens[:, d]]
    return tokens, qs, rows


def chi_square_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test of counts [V] against expected counts [V] (bins under 5 pooled)."""
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().reshape(1)])
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep].double(), exp[keep].double()
    stat = ((obs - exp) ** 2 / exp).sum()
    df = torch.tensor(float(keep.sum() - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, stat / 2))


def depth_checks(out: torch.Tensor, n_acc: torch.Tensor, p: torch.Tensor):
    """(depth, observed, expected) per depth with enough runs: token j among runs that accepted
    j nodes against P[j, token j - 1]."""
    checks = []
    for j in range(out.shape[1]):
        reached = n_acc >= j
        if int(reached.sum()) < 200:
            continue
        tok = out[reached, j]
        prev = out[reached, j - 1] if j else torch.full_like(tok, ROOT)
        checks.append((j, torch.bincount(tok, minlength=V).double(), p[j, prev].double().sum(0)))
    return checks


def run_mixed(shape, seed: int, sparse: bool):
    """One batch of 3N copies: unseeded, seeded (seed = copy index) and greedy rows interleaved
    -> (out, n_acc, kinds, tokens, rows, parents)."""
    gen = torch.Generator().manual_seed(seed)
    p, q = markov(seed, max_depth(shape))
    b, m = 3 * N, len(shape)
    tokens, qs, rows = draw_trees(shape, p, q, b, gen)
    kinds = torch.arange(b) % 3  # 0 unseeded, 1 seeded, 2 greedy
    seeds = [i if k == 1 else None for i, k in enumerate(kinds.tolist())]
    parents = [[par for par, _ in shape]] * b
    if all(isinstance(how, tuple) for _, how in shape):
        draft_probs = None
    elif sparse:
        draft_probs = SparseProbs(torch.arange(V).repeat(b * m, 1), qs.reshape(b * m, V))
    else:
        draft_probs = qs.reshape(b * m, V)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        res = tree_rejection_sample(rows.reshape(-1, V), tokens.reshape(-1), parents,
                                    torch.full((b,), m), draft_probs, kinds == 2, seeds)
    return p, res, kinds, tokens, rows, parents


def max_depth(shape) -> int:
    depth = []
    for parent, _ in shape:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return max(depth)


def greedy_walk(rows: torch.Tensor, tokens: list[int], parents: list[int], choose) -> list[int]:
    """The textbook walk for a deterministic row: descend to the first child equal to the
    choice at the current row, else emit the choice. rows [M + 1, V]; choose(row, depth)."""
    out, node, depth = [], -1, 0
    while True:
        g = choose(rows[node + 1], depth)
        kids = [d for d, par in enumerate(parents) if par == node and tokens[d] == g]
        out.append(g)
        if not kids:
            return out
        node, depth = kids[0], depth + 1


def check_tree_distribution(name: str, sparse: bool = False) -> None:
    shape = SHAPES[name]
    p, res, kinds, tokens, rows, parents = run_mixed(shape, 11 + len(name), sparse)
    out, n_acc = res.output_token_ids, res.num_accepted
    checks = []
    for kind in (0, 1):  # unseeded, and seeded across seeds
        sel = kinds == kind
        checks += [(kind, *c) for c in depth_checks(out[sel], n_acc[sel], p)]
    assert len(checks) >= 4, checks
    alpha = FAMILY_ALPHA / len(checks)
    for kind, j, obs, exp in checks:
        pval = chi_square_pvalue(obs, exp)
        assert pval > alpha, (name, kind, j, pval, obs.tolist(), exp.tolist())
    # greedy rows: the argmax walk, copy by copy (a few hundred)
    got = res.tokens()
    for i in range(2, 600, 3):
        want = greedy_walk(rows[i], tokens[i].tolist(), parents[i],
                           lambda row, _: int(row.argmax()))
        assert got[i] == want, (name, i)


@pytest.mark.parametrize("name", list(SHAPES))
def test_every_depth_is_distributed_as_the_target(name):
    check_tree_distribution(name)


def test_sparse_draft_probs_are_distributed_as_the_target():
    check_tree_distribution("mixed", sparse=True)


def test_the_check_catches_a_residual_not_updated_between_siblings(monkeypatch):
    import planted_bugs as bug

    check_tree_distribution("star-det")  # the real sampler passes
    bug.tree_residual_not_updated(monkeypatch)
    with pytest.raises(AssertionError):
        check_tree_distribution("star-det")


def random_tree(rng: random.Random, rows_for, likely=lambda row, depth: int(row.argmax()),
                n_max: int = 7):
    """A random tree whose tokens often are the likely choice at their parent's row (so a walk
    descends), siblings may repeat a token. rows_for(parents, tokens) -> target rows [M + 1, V];
    likely(row, depth of the row) -> token."""
    m = rng.randint(0, n_max)
    parents = [rng.randint(-1, d - 1) for d in range(m)]
    tokens = [rng.randrange(V) for _ in range(m)]
    rows = rows_for(parents, tokens)
    depth = []
    for d in range(m):
        depth.append(0 if parents[d] < 0 else depth[parents[d]] + 1)
        if rng.random() < 0.6:
            tokens[d] = likely(rows[parents[d] + 1], depth[d])
            rows = rows_for(parents, tokens)
    return parents, tokens, rows


def test_greedy_paths_match_the_walk_over_random_trees():
    rng, gen = random.Random(5), torch.Generator().manual_seed(5)
    trees = []
    for _ in range(60):
        fixed = torch.softmax(2 * torch.randn(8, V, generator=gen), -1)
        trees.append(random_tree(rng, lambda par, tok, f=fixed: f[:len(tok) + 1]))
    rows = torch.cat([t[2] for t in trees])
    res = tree_rejection_sample(rows, torch.tensor([x for t in trees for x in t[1]],
                                                   dtype=torch.long),
                                [t[0] for t in trees], [len(t[1]) for t in trees], None,
                                [True] * len(trees))
    for (parents, tokens, r), got, path in zip(trees, res.tokens(), res.paths()):
        assert got == greedy_walk(r, tokens, parents, lambda row, _: int(row.argmax()))
        assert [tokens[d] for d in path] == got[:-1]
        assert all(parents[b] == a for a, b in zip([-1] + path, path))  # a root-to-node path


def test_seeded_rows_take_the_keyed_choice_whatever_the_tree():
    """Coupling: a seeded sequence's tokens are its keyed samples, position = sample position +
    depth, whatever was drafted; the same as the chain sampler's along the path."""
    rng = random.Random(9)
    p, _ = markov(9, 8)
    seed, start = 1234, 40

    def rows_for(parents, tokens):  # Markov target: the row after a token depends on it
        depth, out = [], [p[0, ROOT]]
        for par, tok in zip(parents, tokens):
            depth.append(1 if par < 0 else depth[par] + 1)
            out.append(p[depth[-1], tok])
        return torch.stack(out)

    prev = ROOT
    truth = []
    for j in range(9):
        g = int(keyed_argmax(p[j, prev][None], [noise_key(seed, start + j)])[0])
        truth.append(g)
        prev = g
    lengths = set()
    for _ in range(80):
        parents, tokens, rows = random_tree(rng, rows_for, lambda row, depth: truth[depth])
        layout = StepLayout.for_drafts([len(tokens)], [start])
        res = tree_rejection_sample(rows, torch.tensor(tokens, dtype=torch.long), [parents],
                                    layout, None, [False], [seed])
        got = res.tokens()[0]
        assert got == truth[:len(got)]
        lengths.add(len(got))
        # the chain sampler fed the accepted path as a chain emits the same tokens
        path = res.paths()[0]
        chain = rejection_sample(torch.stack([rows[0]] + [rows[d + 1] for d in path]),
                                 torch.tensor([tokens[d] for d in path], dtype=torch.long),
                                 StepLayout.for_drafts([len(path)], [start]),
                                 None, [False], [seed], impl="reference")
        assert chain.tokens()[0] == got
    assert len(lengths) >= 3, lengths  # the trees did reach different depths


def one_hot_rows(tokens: list[int]) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(tokens), V).float()


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_path_tokens_and_kept_rows_of_a_hand_made_tree(greedy):
    # root -> {5, 1}; 1 -> {2, 3}; 3 -> {4}; target: after the root 1, after node 1 3, after
    # node 3 4, after node 4 0 (the bonus). One-hot p and q: sampled rows decide the same way.
    parents, tokens = [-1, -1, 1, 1, 3], [5, 1, 2, 3, 4]
    rows = one_hot_rows([1, 5, 3, 0, 4, 0])
    layout = StepLayout.build([3 + 5], [10], [5], [True], [parents])  # 3 uncached rows fed
    res = tree_rejection_sample(rows, torch.tensor(tokens), [parents], layout, None, [greedy])
    assert res.paths() == [[1, 3, 4]]
    # the layout's own trees, as attention saw them, give the same walk
    same = tree_rejection_sample(rows, torch.tensor(tokens), None, layout, None, [greedy])
    assert same.paths() == [[1, 3, 4]] and same.kept_rows() == res.kept_rows()
    assert res.tokens() == [[1, 3, 4, 0]]
    assert res.num_accepted.tolist() == [3]
    assert res.kept_rows() == [[0, 1, 2, 4, 6, 7]]
    # every child of node 1 rejected: recovered at depth 2, kept rows stop at node 1
    rows = one_hot_rows([1, 5, 1, 0, 4, 0])
    res = tree_rejection_sample(rows, torch.tensor(tokens), [parents], [5], None, [greedy])
    assert res.tokens() == [[1, 1]] and res.paths() == [[1]] and res.kept_rows() == [[0, 2]]


def test_a_chain_gives_exactly_the_chain_samplers_result():
    gen = torch.Generator().manual_seed(3)
    for trial in range(12):
        mode = ("none", "dense", "sparse")[trial % 3]
        ks = [int(k) for k in torch.randint(0, 5, (6,), generator=gen)]
        greedy = [bool(g) for g in torch.rand(6, generator=gen) < 0.3]
        seeds = [None if i % 2 else 100 + i for i in range(6)]
        b = random_batch(ks, 16, mode, gen, greedy=greedy)
        layout = StepLayout.for_drafts(ks, [5 + i for i in range(6)])
        parents = [list(range(-1, k - 1)) if trial % 2 else None for k in ks]
        torch.manual_seed(trial)
        want = rejection_sample(b.target_probs, b.draft_token_ids, layout, b.draft_probs,
                                b.is_greedy, seeds, impl="reference")
        torch.manual_seed(trial)
        got = tree_rejection_sample(b.target_probs, b.draft_token_ids, parents, layout,
                                    b.draft_probs, b.is_greedy, seeds)
        assert torch.equal(got.output_token_ids, want.output_token_ids), (trial, mode)
        assert torch.equal(got.num_accepted, want.num_accepted)
        assert got.paths() == [list(range(n)) for n in want.num_accepted.tolist()]


def test_malformed_trees_are_refused():
    rows = torch.softmax(torch.randn(4, V), -1)
    ids = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="parent 3 is not in"):
        tree_rejection_sample(rows, ids, [[-1, 0, 3]], [3], None, [False])
    with pytest.raises(ValueError, match="parent 1 is not in"):
        tree_rejection_sample(rows, ids, [[-1, 1, 0]], [3], None, [False])
    with pytest.raises(ValueError, match="parent -2 is not in"):
        tree_rejection_sample(rows, ids, [[-2, 0, 0]], [3], None, [False])
    with pytest.raises(ValueError, match="2 parents for 3"):
        tree_rejection_sample(rows, ids, [[-1, 0]], [3], None, [False])
    with pytest.raises(ValueError, match="draft_parents has 2 entries"):
        tree_rejection_sample(rows, ids, [None, None], [3], None, [False])
    # 2 uncached rows (the last is the root), 3 nodes
    tree = StepLayout.build([2 + 3], [4], [3], [True], [[-1, -1, 0]])
    with pytest.raises(ValueError, match="differ from the trees the step layout placed"):
        tree_rejection_sample(rows, ids, [[-1, 0, 0]], tree, None, [False])
    with pytest.raises(ValueError, match="draft_parents is needed"):
        tree_rejection_sample(rows, ids, None, [3], None, [False])
    with pytest.raises(ValueError, match="target_probs"):
        tree_rejection_sample(rows[:3], ids, [None], [3], None, [False])
    with pytest.raises(ValueError, match="draft_token_ids"):
        tree_rejection_sample(rows, ids[:2], [None], [3], None, [False])
