"""Suffix proposer: drafts from the longest match over the current sequence and every earlier
request (of every stream), by frequency, within a bounded memory."""

from __future__ import annotations

import random

import pytest

from proposer_service.config import ProposerConfig
from proposer_service.suffix import SuffixOptions, SuffixProposer
from splitspec.config import parse_config
from splitspec.proposal import SequenceStep


def full(seq_id: str, tokens: list[int], k: int) -> SequenceStep:
    return SequenceStep(seq_id, list(tokens), len(tokens), k, full_history=True)


def serve(session, seq_id: str, tokens: list[int]) -> None:
    """A finished request: its history was heard, then it was released."""
    session.propose([full(seq_id, tokens, 0)])
    session.release([seq_id])


def test_an_earlier_request_of_another_stream_supplies_the_draft():
    proposer = SuffixProposer()
    task = [50, 51, 52, 53, 60, 61, 62, 63, 64, 65]
    serve(proposer.open_session(), "earlier", task)  # another verifier's stream
    (d,) = proposer.open_session().propose([full("now", [7, 8, 50, 51, 52, 53], 5)])
    assert d.tokens == [60, 61, 62, 63, 64] and d.q is None and not d.resync


def test_the_longest_match_wins_and_the_frequent_continuation_is_drafted():
    proposer = SuffixProposer(SuffixOptions(min_prob=0.5))
    session = proposer.open_session()
    serve(session, "a", [1, 2, 3, 9, 9])       # matches the last 2 tokens of [..., 2, 3]
    serve(session, "b", [5, 1, 2, 3, 7, 7])    # matches 3 tokens: the longest match
    serve(session, "c", [6, 1, 2, 3, 7, 8])    # matches 3 tokens too, continues differently
    serve(session, "d", [4, 1, 2, 3, 7, 7])
    (d,) = session.propose([full("x", [0, 1, 2, 3], 4)])
    # longest matches (b, c, d) vote: 7 (3/3), then 7 (2/3 >= 0.5 * 1), then nothing follows
    assert d.tokens == [7, 7]


def test_an_ambiguous_continuation_drafts_less_than_a_frequent_one():
    proposer = SuffixProposer(SuffixOptions(min_prob=0.3))
    session = proposer.open_session()
    for i in range(4):  # "10 11" always continues 12 13 14 15 16
        serve(session, f"same{i}", [10, 11, 12, 13, 14, 15, 16])
    for i, t in enumerate([21, 22, 23, 24]):  # "30 31" continues differently every time
        serve(session, f"diff{i}", [30, 31, t, t + 1, t + 2])
    (freq,) = session.propose([full("f", [10, 11], 8)])
    (ambiguous,) = session.propose([full("g", [30, 31], 8)])
    assert freq.tokens == [12, 13, 14, 15]  # alpha = 2 tokens per matched token: 2 * 2
    assert ambiguous.tokens == []  # 1/4 < 0.3


def test_the_sequence_itself_is_matched_but_not_at_its_own_end():
    session = SuffixProposer().open_session()
    hist = [7, 8, 9, 1, 2, 7, 8]
    (d,) = session.propose([full("s", hist, 3)])
    assert d.tokens == [9, 1, 2]
    (d,) = session.propose([SequenceStep("s", [9, 1], len(hist) + 2, 3)])  # a delta
    assert d.tokens == [2, 7, 8]


def test_memory_is_bounded_and_the_oldest_requests_go_first():
    proposer = SuffixProposer(SuffixOptions(max_cached_tokens=40))
    session = proposer.open_session()
    serve(session, "old", [90, 91, 92, 93, 94, 95, 96, 97, 98, 99])
    for i in range(5):
        serve(session, f"new{i}", [100 + 10 * i + j for j in range(10)])
    assert len(proposer.index) <= 40 and proposer.index.num_docs <= 4
    (d,) = session.propose([full("q", [90, 91], 3)])
    assert d.tokens == []  # evicted
    (d,) = session.propose([full("r", [140, 141], 3)])
    assert d.tokens == [142, 143, 144]


def test_inconsistent_deltas_ask_for_a_resync_and_a_full_history_rebuilds():
    session = SuffixProposer().open_session()
    (d,) = session.propose([SequenceStep("u", [1, 2], 5, 2)])  # never heard of
    assert d.resync
    session.propose([full("v", [1, 2, 3, 4], 0)])
    (d,) = session.propose([SequenceStep("v", [5], 9, 2)])  # length disagrees
    assert d.resync
    (d,) = session.propose([full("v", [6, 7, 6, 7], 2)])
    assert not d.resync and d.tokens == [6, 7]


def test_options_come_from_method_option_flags():
    config = parse_config(ProposerConfig, ["--method", "suffix", "--method-option", "max_depth=8",
                                           "--method-option", "min_prob=0.25"])
    proposer = SuffixProposer.from_config(config)
    assert proposer.index.options.max_depth == 8 and proposer.index.options.min_prob == 0.25
    assert proposer.describe().method == "suffix"
    with pytest.raises(SystemExit, match="unknown suffix option"):
        SuffixOptions.parse({"depth": "3"})
    with pytest.raises(SystemExit, match="bad suffix option"):
        SuffixOptions.parse({"alpha": "many"})


def test_a_branching_step_drafts_every_continuation_of_a_tie():
    proposer = SuffixProposer()
    session = proposer.open_session()
    serve(session, "a", [7, 8, 50, 51])
    serve(session, "b", [7, 8, 60, 61])  # as likely, and more recent
    (chain,) = session.propose([full("c", [7, 8], 4)])
    assert chain.tokens == [60, 61] and chain.parents == [-1, 0]
    step = SequenceStep("t", [7, 8], 2, 4, full_history=True, max_branch=2)
    (tree,) = session.propose([step])
    assert tree.tokens == [60, 61, 50, 51] and tree.parents == [-1, 0, -1, 2] and tree.q is None
    step = SequenceStep("u", [7, 8], 2, 3, full_history=True, max_branch=2)
    (cut,) = session.propose([step])
    assert cut.tokens == [60, 61, 50] and cut.parents == [-1, 0, -1]


def test_a_chain_step_is_exactly_the_vote_and_the_vote_is_the_trees_best_path():
    for trial in range(30):
        def served(trial=trial):
            rng = random.Random(trial)
            proposer = SuffixProposer(SuffixOptions(min_prob=rng.choice([0.0, 0.1, 0.3]),
                                                    alpha=rng.choice([1.0, 2.0])))
            session = proposer.open_session()
            for i in range(rng.randrange(1, 12)):
                serve(session, f"r{i}", [rng.randrange(4) for _ in range(rng.randrange(2, 30))])
            hist = [rng.randrange(4) for _ in range(rng.randrange(2, 12))]
            return proposer, session, hist, rng.randrange(1, 9)

        proposer, session, hist, k = served()
        (chain,) = session.propose([full("s", hist, k)])
        _, session, _, _ = served()
        (one,) = session.propose([SequenceStep("s", hist, len(hist), k, full_history=True,
                                               max_branch=1)])
        assert one.tokens == chain.tokens and one.parents == list(range(-1, len(one.tokens) - 1))
        index = proposer.index
        assert index.propose_tree(hist, k, None, 1) == (index.propose(hist, k, None),
                                                        chain.parents)
        tokens, parents = index.propose_tree(hist, k, None, max_branch=3)
        assert len(tokens) <= k and all(-1 <= p < i for i, p in enumerate(parents))
        # every first child leads down the vote's path (as far as the budget let it go)
        path, node = [], -1
        while node in parents:
            node = parents.index(node)
            path.append(tokens[node])
        assert path == chain.tokens[:len(path)], trial
