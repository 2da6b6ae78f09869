"""The n-gram proposer: chains from the latest match (exactly, when a step may not branch) and
trees of every distinct continuation when it may."""

import random

from kernels.ngram import ngram_candidates, ngram_continuations
from proposer_service.ngram import NgramProposer
from splitspec.proposal import SequenceStep


def test_ngram_session_proposes_from_the_latest_match_and_asks_for_resync():
    session = NgramProposer(min_n=1, max_n=3).open_session()
    hist = [7, 8, 9, 1, 2, 7, 8]
    (d,) = session.propose([SequenceStep("s", hist, len(hist), 3, full_history=True)])
    assert d.tokens == [9, 1, 2] and d.q is None and not d.resync
    (d,) = session.propose([SequenceStep("s", [9], len(hist) + 1, 2)])
    assert d.tokens == [1, 2]
    (d,) = session.propose([SequenceStep("unknown", [1], 5, 2)])
    assert d.resync and d.tokens == []
    session.release(["s"])
    (d,) = session.propose([SequenceStep("s", [1], len(hist) + 2, 2)])
    assert d.resync


def test_no_match_and_k_zero_give_no_tokens():
    session = NgramProposer().open_session()
    (d,) = session.propose([SequenceStep("s", [1, 2, 3], 3, 4, full_history=True)])
    assert d.tokens == []
    (d,) = session.propose([SequenceStep("s", [1, 2], 5, 0)])
    assert d.tokens == []


def test_max_branch_one_is_exactly_the_chain():
    rng = random.Random(3)
    proposer = NgramProposer(min_n=1, max_n=3)
    for _ in range(100):
        hist = [rng.randrange(4) for _ in range(rng.randrange(2, 40))]
        k = rng.randrange(1, 8)
        (d,) = proposer.open_session().propose([SequenceStep("s", hist, len(hist), k,
                                                             full_history=True, max_branch=1)])
        found = ngram_candidates(hist, 1, 3, k)
        assert d.tokens == (found[0] if found else []) and d.parents == list(range(-1, k - 1))[
            :len(d.tokens)]


def test_a_branching_step_merges_every_continuation_frequent_first():
    session = NgramProposer(min_n=1, max_n=3).open_session()
    hist = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2]  # after [1, 2]: 3 twice, 4 once (most recently)
    (chain,) = session.propose([SequenceStep("c", hist, len(hist), 3, full_history=True)])
    assert chain.tokens == [4, 1, 2]  # the chain copies the most recent occurrence
    (d,) = session.propose([SequenceStep("s", hist, len(hist), 3, full_history=True,
                                         max_branch=2)])
    assert d.tokens == [3, 1, 2] and d.parents == [-1, 0, 1]  # 2 of 3 occurrences: deepest
    # 6 tokens ahead every occurrence differs: [3, 1, 2] (2/3) first, then the most recent
    # branch wins the ties at 1/3
    (d,) = session.propose([SequenceStep("t", hist, len(hist), 6, full_history=True,
                                         max_branch=2)])
    assert d.tokens == [3, 1, 2, 4, 1, 2] and d.parents == [-1, 0, 1, -1, 3, 4]
    assert d.q is None


def test_branching_trees_hold_only_real_continuations_within_budget():
    rng = random.Random(11)
    proposer = NgramProposer(min_n=1, max_n=4)
    for _ in range(100):
        hist = [rng.randrange(3) for _ in range(rng.randrange(2, 50))]
        k, branch = rng.randrange(1, 10), rng.randrange(2, 4)
        (d,) = proposer.open_session().propose([SequenceStep("s", hist, len(hist), k,
                                                             full_history=True,
                                                             max_branch=branch)])
        conts = [c for c, _ in ngram_continuations(hist, 1, 4, k, 10_000)]
        assert len(d.tokens) == len(d.parents) <= k
        assert bool(d.tokens) == bool(conts)
        children: dict[int, int] = {}
        for i, p in enumerate(d.parents):
            assert -1 <= p < i
            children[p] = children.get(p, 0) + 1
            path = [d.tokens[i]]
            while p >= 0:
                path.insert(0, d.tokens[p])
                p = d.parents[p]
            assert any(c[:len(path)] == path for c in conts)  # a prefix of a real continuation
        assert max(children.values(), default=0) <= branch
        # a single continuation is a chain, however much branching is allowed
        if len(conts) == 1:
            assert d.tokens == conts[0] and d.parents == list(range(-1, k - 1))


def test_a_step_matches_with_its_requests_range_not_the_proposers():
    """prompt_lookup_min/max travel per sequence: a history where only a 1-token suffix
    matches drafts under the proposer's own [1, 3] but not under a request's [2, 3]; one where
    only a 4-token suffix tells the continuations apart copies the right one under [4, 4]."""
    proposer = NgramProposer(min_n=1, max_n=3)
    hist = [5, 1, 2, 3, 9, 9, 4, 5]  # the suffix [5] occurs once before; [4, 5] never
    (own,) = proposer.open_session().propose([SequenceStep("s", hist, len(hist), 2,
                                                           full_history=True)])
    assert own.tokens == [1, 2]
    (shaped,) = proposer.open_session().propose([SequenceStep(
        "s", hist, len(hist), 2, full_history=True, ngram_min=2, ngram_max=3)])
    assert shaped.tokens == []
    # after [1, 2, 3, 4]: 7 followed it; after [2, 3, 4] alone the latest occurrence says 8
    hist = [1, 2, 3, 4, 7, 0, 2, 3, 4, 8, 0, 1, 2, 3, 4]
    (own,) = proposer.open_session().propose([SequenceStep("s", hist, len(hist), 1,
                                                           full_history=True)])
    assert own.tokens == [8]
    (shaped,) = proposer.open_session().propose([SequenceStep(
        "s", hist, len(hist), 1, full_history=True, ngram_min=4, ngram_max=4)])
    assert shaped.tokens == [7]
    # a bound given alone moves the proposer's other one where they would cross
    (alone,) = proposer.open_session().propose([SequenceStep(
        "s", hist, len(hist), 1, full_history=True, ngram_min=4)])
    assert alone.tokens == [7]


def test_the_range_crosses_the_wire_per_sequence():
    from splitspec.proposal import step_from_pb, step_to_pb
    step = SequenceStep("s", [1, 2], 2, 3, ngram_min=2, ngram_max=5)
    back = step_from_pb(step_to_pb(step))
    assert (back.ngram_min, back.ngram_max) == (2, 5)
    assert step_from_pb(step_to_pb(SequenceStep("s", [1], 1, 1))).ngram_min == 0
