"""Prefix caching, the scheduler's side: which of a request's leading blocks it takes from the
cache when it is admitted, and which of its blocks it offers the cache after a step.

    admitted   its prompt's full blocks (all but the last token, whose logits the step needs)
               are keyed (verifier_service/kv/prefix.py) and the longest cached run is shared:
               the sequence starts with num_computed = hits x block_size
    a step     the blocks its kept rows fill are final; they are offered under their keys
    finished   (or preempted) its blocks are released: the cached ones stay on the queue,
               so a preempted sequence re-admitted later finds its own blocks again

A method that keeps per-position state of its own beside the target's cache (an EAGLE head's
rows) may allow fewer blocks than the cache holds (`reuse_limit`): what it cannot restore,
the target computes again.

The counters are vLLM's: queries and hits in prompt tokens, one query per admission.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from verifier_service.batching.sequence import SequenceState
from verifier_service.kv.cache import PagedKVCache
from verifier_service.kv.prefix import extend_keys, root_key


@dataclass
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up (at each admission)
    hits: int = 0  # of those, found cached


class PrefixCache:
    def __init__(self, kv: PagedKVCache, model: str,
                 reuse_limit: Callable[[SequenceState, list[bytes]], int] | None = None):
        self.kv = kv
        self.model = model
        # (sequence, its keys) -> how many leading blocks the sequence may take from the cache
        self.reuse_limit = reuse_limit
        self.stats = PrefixCacheStats()

    def keys(self, seq: SequenceState, num_tokens: int) -> list[bytes]:
        """The keys of the sequence's full blocks within its first num_tokens tokens."""
        if seq.block_root is None:
            seq.block_root = root_key(self.model, seq.inp.cache_salt)
        return extend_keys(seq.block_keys, seq.block_root, seq.tokens, self.kv.block_size,
                           num_tokens)[:num_tokens // self.kv.block_size]

    def hits(self, seq: SequenceState) -> list[int]:
        """Cached blocks the sequence can start with: at least its last token stays to
        compute (the step needs its logits)."""
        keys = self.keys(seq, len(seq.tokens) - 1)
        if self.reuse_limit is not None:
            keys = keys[:self.reuse_limit(seq, keys)]
        return self.kv.lookup(keys)

    def admitted(self, seq: SequenceState, hits: list[int]) -> None:
        """The sequence joins the batch with the blocks `hits` shared (counted as a query)."""
        if hits:
            self.kv.share(seq.blocks, hits)
        seq.num_computed = len(hits) * self.kv.block_size
        if seq.cached_tokens is None:  # the first admission's, as usage reports it
            seq.cached_tokens = seq.num_computed
        self.stats.queries += len(seq.tokens)
        self.stats.hits += seq.num_computed

    def commit(self, seq: SequenceState) -> None:
        """After a step: the blocks its kept rows fill go to the cache."""
        # a stop condition may have kept fewer tokens than rows: only rows with their token
        n = min(seq.num_computed, len(seq.tokens))
        if n // self.kv.block_size > seq.blocks.num_final:
            self.kv.commit(seq.blocks, self.keys(seq, n), n)
