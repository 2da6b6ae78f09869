"""splitspec/history_store.py: the token histories both ends of the Propose stream rebuild from
deltas, checked against the length the verifier sends."""

from splitspec.history_store import HistoryStore
from splitspec.proposal import SequenceStep


def test_history_is_rebuilt_from_deltas_and_checked():
    store = HistoryStore()
    assert store.apply(SequenceStep("a", [1, 2], 2, 3)) is None  # unknown, sent as a delta
    assert store.apply(SequenceStep("a", [1, 2], 2, 3, full_history=True)) == [1, 2]
    assert store.apply(SequenceStep("a", [3, 4], 4, 3)) == [1, 2, 3, 4]
    assert store.apply(SequenceStep("a", [5], 9, 3)) is None  # length disagrees: resync
    assert "a" not in store


def test_idle_sequences_are_evicted():
    store = HistoryStore(idle_timeout_s=10)
    store.apply(SequenceStep("a", [1], 1, 1, full_history=True))
    assert store.evict_idle(now=1e12) == ["a"] and len(store) == 0
