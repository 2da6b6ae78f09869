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
