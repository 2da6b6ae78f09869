"""Prompt-lookup (n-gram) proposer: copies what followed the latest earlier occurrence of the
sequence's longest matching suffix. No model, no vocabulary: deterministic one-hot drafts."""

from __future__ import annotations

from kernels.ngram import ngram_candidates
from proposer_service.base import HistoryStore, Proposer, ProposerSession
from splitspec.proposal import Draft, ProposerDescription, SequenceStep


class NgramSession(ProposerSession):
    def __init__(self, min_n: int, max_n: int, idle_timeout_s: float):
        self._min_n, self._max_n = min_n, max_n
        self._store = HistoryStore(idle_timeout_s)

    def propose(self, steps: list[SequenceStep]) -> list[Draft]:
        self._store.evict_idle()
        drafts = []
        for step in steps:
            history = self._store.apply(step)
            if history is None:
                drafts.append(Draft(step.seq_id, resync=True))
                continue
            tokens: list[int] = []
            if step.k > 0:
                found = ngram_candidates(history, self._min_n, self._max_n, step.k)
                tokens = found[0] if found else []
            drafts.append(Draft(step.seq_id, tokens=tokens))
        return drafts

    def release(self, seq_ids: list[str]) -> None:
        self._store.release(seq_ids)

    def close(self) -> None:
        self._store.clear()


class NgramProposer(Proposer):
    def __init__(self, min_n: int = 1, max_n: int = 4, max_k: int = 16,
                 idle_timeout_s: float = 600.0):
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self._min_n, self._max_n, self._max_k = min_n, max_n, max_k
        self._idle_timeout_s = idle_timeout_s

    def describe(self) -> ProposerDescription:
        return ProposerDescription(method="ngram", max_num_speculative_tokens=self._max_k,
                                   model=f"ngram[{self._min_n},{self._max_n}]")

    def open_session(self) -> NgramSession:
        return NgramSession(self._min_n, self._max_n, self._idle_timeout_s)
