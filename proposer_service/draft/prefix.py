"""Prefix reuse for the draft model's own KV: a sequence that starts the way another one did
(the same system prompt, the previous turn of a chat) starts from a copy of that one's draft
cache instead of prefilling the draft over the whole prompt again.

The draft's keys and values for a token list are a function of those tokens alone, so any
common prefix of a new history and a cached token list (a running sequence's, or a finished
one's kept here) is valid to reuse, drafted tokens included. The copy is taken, never a view:
a running state may write new columns in place past its length (cache.py, slots.py), where a
view would see them; a new sequence with a slot then copies it into its slot (device copies).

Finished sequences' caches are kept up to a memory budget, least recently used dropped first.
Prefixes shorter than MIN_REUSE tokens are computed again (a copy is not worth it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Iterable

from proposer_service.draft.cache import SeqState, common_prefix

MIN_REUSE = 16


def _bytes(state: SeqState) -> int:
    """Memory a kept state holds on to (the whole buffers under its views)."""
    return sum(k.untyped_storage().nbytes() + v.untyped_storage().nbytes()
               for k, v in state.kv or ())


class DraftPrefixCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes  # 0: no reuse
        self._kept: OrderedDict[int, SeqState] = OrderedDict()
        self._bytes = 0
        self._next = 0
        self._lock = threading.Lock()  # sessions of several verifier streams share it
        self.queries = 0  # prompt tokens of new sequences looked up
        self.hits = 0  # of those, taken from a kept cache

    def wants(self, state: SeqState) -> bool:
        """Whether `keep` would keep this state (a slot's cache is copied out only then)."""
        return self.max_bytes > 0 and state.kv is not None and state.length() >= MIN_REUSE

    def keep(self, state: SeqState | None) -> None:
        """A finished sequence's draft cache, for later prompts that start the same way (its
        own tensors: a state that held a slot gives it back first, its cache copied out)."""
        if state is None or state.slot is not None or not self.wants(state):
            return
        size = _bytes(state)
        if size > self.max_bytes:
            return
        kept = SeqState(state.kv, list(state.cached))  # no store: never written
        with self._lock:
            self._kept[self._next] = kept
            self._next += 1
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, old = self._kept.popitem(last=False)
                self._bytes -= _bytes(old)

    def seed(self, history: list[int], live: Iterable[SeqState]) -> SeqState:
        """A new sequence's state: a copy of the longest cached prefix of its history (all but
        its last token) among the running states and the kept ones, or an empty state."""
        if self.max_bytes <= 0 or len(history) <= MIN_REUSE:
            return SeqState()
        limit = len(history) - 1
        best, best_n, best_id = None, 0, None
        with self._lock:
            candidates = [(None, s) for s in live] + list(self._kept.items())
            for sid, state in candidates:
                if state.kv is None:
                    continue
                n = min(common_prefix(state.cached, history), limit, state.kv[0][0].shape[2])
                if n > best_n:
                    best, best_n, best_id = state, n, sid
            if best_id is not None:
                self._kept.move_to_end(best_id)
            self.queries += len(history)
            if best is None or best_n < MIN_REUSE:
                return SeqState()
            self.hits += best_n
            kv = [(k[:, :, :best_n].clone(), v[:, :, :best_n].clone()) for k, v in best.kv]
        return SeqState(kv, list(history[:best_n]))
