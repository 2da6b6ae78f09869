"""Prompt-lookup (n-gram) proposer: copies what followed the latest earlier occurrence of the
sequence's longest matching suffix. No model, no vocabulary: deterministic one-hot drafts.

A step that allows branching (max_branch > 1) gets a tree instead: the distinct continuations of
every earlier occurrence of that suffix (most frequent first, then most recent) merged into a
trie, its node budget spent best-first by each node's share of the occurrences
(proposer_service/tree_builder.py), so the most frequent continuation goes deepest."""

from __future__ import annotations

from kernels.ngram import ngram_candidates, ngram_continuations
from proposer_service.base import HistorySession, Proposer
from proposer_service.tree_builder import ContinuationTrie
from splitspec.params import prompt_lookup_range
from splitspec.proposal import Draft, ProposerDescription, SequenceStep


class NgramSession(HistorySession):
    def __init__(self, min_n: int, max_n: int, idle_timeout_s: float):
        super().__init__(idle_timeout_s)
        self._min_n, self._max_n = min_n, max_n

    def draft(self, step: SequenceStep, history: list[int]) -> Draft:
        if step.k <= 0:
            return Draft(step.seq_id)
        # the request's match range (prompt_lookup_min/max) where it gave one, else our own
        min_n, max_n = prompt_lookup_range(step.ngram_min, step.ngram_max, self._min_n,
                                           self._max_n)
        if step.max_branch <= 1:
            found = ngram_candidates(history, min_n, max_n, step.k)
            return Draft(step.seq_id, tokens=found[0] if found else [])
        # the k most frequent continuations: each adds at least one node, so the rest could only
        # add nodes past the budget (shares are estimated among these k)
        trie = ContinuationTrie()
        for cont, count in ngram_continuations(history, min_n, max_n, step.k,
                                               max_candidates=step.k):
            trie.insert(cont, count)
        tokens, parents = trie.tree(step.k, step.max_branch)
        return Draft(step.seq_id, tokens=tokens, parents=parents)


class NgramProposer(Proposer):
    def __init__(self, min_n: int = 1, max_n: int = 4, max_k: int = 16,
                 idle_timeout_s: float = 600.0):
        if not 1 <= min_n <= max_n:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self._min_n, self._max_n, self._max_k = min_n, max_n, max_k
        self._idle_timeout_s = idle_timeout_s

    @classmethod
    def from_config(cls, config) -> "NgramProposer":
        return cls(config.ngram_min, config.ngram_max, config.max_num_speculative_tokens,
                   config.idle_timeout_s)

    def describe(self) -> ProposerDescription:
        return ProposerDescription(method="ngram", max_num_speculative_tokens=self._max_k,
                                   model=f"ngram[{self._min_n},{self._max_n}]")

    def open_session(self) -> NgramSession:
        return NgramSession(self._min_n, self._max_n, self._idle_timeout_s)
