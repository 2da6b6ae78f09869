"""Suffix proposer: drafts from the longest match of the sequence's suffix in everything this
proposer has served: the current sequence and every earlier request of every verifier.

Agents, tool loops and templated traffic send the same task family again and again, so the best
guess for what follows is often what followed the same text in an earlier request (SuffixDecoding,
Oliaro et al.; Arctic Inference). One proposer service sees the traffic of every verifier replica
it serves, so one index learns from all of them; an in-process proposer cannot do that.

The index. Every sequence the proposer hears of (prompt + output, as the verifier's deltas arrive)
is a document: its tokens in an int32 array, kept after the request ends. A hash map from each
2-token window to the most recent positions it ends at (a bounded deque per key) finds candidate
matches; each candidate's true match length is counted backwards, up to `max_depth` tokens.
Memory is bounded: documents are dropped least recently used once `max_cached_tokens` is reached
(their index entries go stale and are skipped, then pushed out by newer ones).

A proposal. Among the candidates with the longest match, the continuations vote token by token:
the most frequent next token is drafted while its share of the agreeing candidates, multiplied
along the draft, stays at or above `min_prob`, and the draft is at most `alpha` tokens per matched
token (and at most k). A long, frequent match drafts many tokens; a rare or short one few or none.
Drafts are token ids only (one-hot), verified like any other.

A tree (a step with max_branch > 1): the same candidates' continuations merged into a trie
(proposer_service/tree_builder.py); a node's estimated probability is the vote's product along
its own branch, and the node budget k goes best-first by it, so the frequent continuation goes
deepest and a near-tie branches instead of stopping; min_prob and alpha bound every branch as
they bound the chain, whose tokens are the tree's best path.

Method options (--method-option KEY=VALUE): max_depth (32), max_cached_tokens (1000000),
min_prob (0.1), alpha (2.0), max_candidates (64).
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass

from proposer_service.base import HistorySession, Proposer
from proposer_service.tree_builder import ContinuationTrie
from splitspec.proposal import Draft, ProposerDescription, SequenceStep

KEY_LEN = 2  # tokens in an index key: the shortest match that can draft


@dataclass(frozen=True)
class SuffixOptions:
    max_depth: int = 32  # longest match counted
    max_cached_tokens: int = 1_000_000  # documents kept, in tokens (LRU beyond)
    min_prob: float = 0.1  # stop drafting when the draft's estimated probability falls below
    alpha: float = 2.0  # at most alpha draft tokens per matched token
    max_candidates: int = 64  # most recent occurrences examined per proposal
    max_positions_per_key: int = 256  # occurrences remembered per index key

    @classmethod
    def parse(cls, options: dict[str, str]) -> "SuffixOptions":
        kinds = {f: type(getattr(cls(), f)) for f in cls.__dataclass_fields__}
        unknown = set(options) - set(kinds)
        if unknown:
            raise SystemExit(f"error: unknown suffix option(s) {sorted(unknown)}; "
                             f"known: {sorted(kinds)}")
        try:
            out = cls(**{k: kinds[k](v) for k, v in options.items()})
        except ValueError as exc:
            raise SystemExit(f"error: bad suffix option: {exc}") from None
        if out.max_depth < KEY_LEN or out.max_cached_tokens < 1 or out.alpha <= 0 \
                or not 0 <= out.min_prob <= 1 or out.max_candidates < 1:
            raise SystemExit("error: suffix options out of range")
        return out


class SuffixIndex:
    """Documents of tokens plus a 2-token-window index of where each window ends. Thread-safe:
    every stream of the proposer service shares one index."""

    def __init__(self, options: SuffixOptions):
        self.options = options
        self._docs: OrderedDict[int, array] = OrderedDict()  # doc id -> tokens, LRU order
        self._index: dict[tuple[int, int], deque[tuple[int, int]]] = {}
        self._tokens = 0
        self._next_id = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._tokens

    @property
    def num_docs(self) -> int:
        return len(self._docs)

    def new_doc(self) -> int:
        with self._lock:
            self._next_id += 1
            self._docs[self._next_id] = array("i")
            return self._next_id

    def extend(self, doc: int, tokens: list[int]) -> None:
        """Append tokens to a document (re-created if it was evicted) and index them."""
        with self._lock:
            buf = self._docs.get(doc)
            if buf is None:
                buf = self._docs[doc] = array("i")
            self._docs.move_to_end(doc)
            start = len(buf)
            buf.extend(tokens)
            self._tokens += len(tokens)
            cap = self.options.max_positions_per_key
            for end in range(max(start, KEY_LEN), len(buf) + 1):
                key = (buf[end - 2], buf[end - 1])
                self._index.setdefault(key, deque(maxlen=cap)).append((doc, end))
            self._evict(keep=doc)

    def holds_prefix(self, doc: int, tokens: list[int]) -> bool:
        """Whether the document (still) starts with exactly these tokens."""
        with self._lock:
            buf = self._docs.get(doc)
            return buf is not None and buf[:len(tokens)].tolist() == tokens

    def _evict(self, keep: int) -> None:
        while self._tokens > self.options.max_cached_tokens and len(self._docs) > 1:
            oldest = next(iter(self._docs))
            if oldest == keep:
                self._docs.move_to_end(oldest)
                continue
            self._tokens -= len(self._docs.pop(oldest))

    def propose(self, history: list[int], k: int, own: int | None) -> list[int]:
        """Up to k tokens continuing `history`; `own` is its own document (whose end is not a
        match of itself)."""
        if k <= 0:
            return []
        with self._lock:
            best, found = self._longest_matches(history, own)
            if not found:
                return []
            return _vote(found, min(k, int(self.options.alpha * best)), self.options.min_prob)

    def propose_tree(self, history: list[int], k: int, own: int | None,
                     max_branch: int) -> tuple[list[int], list[int]]:
        """A tree of up to k nodes continuing `history` (tokens, parents): the continuations of
        the longest matches merged into a trie, the budget spent best-first by estimated
        probability (the chain's vote, per branch), no node below min_prob, no deeper than
        alpha tokens per matched token."""
        if k <= 0:
            return [], []
        with self._lock:
            best, found = self._longest_matches(history, own)
            depth = min(k, int(self.options.alpha * best))
            trie = ContinuationTrie()
            for buf, end in found:  # most recent first: it wins ties
                trie.insert(buf[end:end + depth])
        return trie.tree(k, max_branch, self.options.min_prob)

    def _longest_matches(self, history: list[int],
                         own: int | None) -> tuple[int, list[tuple[array, int]]]:
        """(match length, [(document, end)] most recent first) of the longest matches of the
        history's suffix among the most recent candidates. Call with the lock held."""
        o = self.options
        occurrences = self._index.get((history[-2], history[-1])) \
            if len(history) >= KEY_LEN else None
        best, found = 0, []
        for doc, end in list(reversed(occurrences or ()))[:o.max_candidates]:
            buf = self._docs.get(doc)
            if buf is None or end >= len(buf) or (doc == own and end >= len(history)):
                continue  # evicted, nothing follows, or the sequence's own end
            m = _match_length(buf, end, history, o.max_depth)
            if m > best:
                best, found = m, []
            if m == best:
                found.append((buf, end))
        return best, found


def _match_length(buf: array, end: int, history: list[int], max_depth: int) -> int:
    """How many tokens before buf[end] equal the last tokens of history (at most max_depth)."""
    n = 0
    top = min(max_depth, end, len(history))
    while n < top and buf[end - 1 - n] == history[-1 - n]:
        n += 1
    return n


def _vote(found: list[tuple[array, int]], limit: int, min_prob: float) -> list[int]:
    """The most frequent continuation, token by token, while its estimated probability holds."""
    draft: list[int] = []
    alive = found
    prob = 1.0
    for j in range(limit):
        counts: dict[int, int] = {}
        for buf, end in alive:
            if end + j < len(buf):
                t = buf[end + j]
                counts[t] = counts.get(t, 0) + 1
        if not counts:
            break
        token, n = max(counts.items(), key=lambda kv: kv[1])
        prob *= n / sum(counts.values())
        if prob < min_prob:
            break
        draft.append(token)
        alive = [(buf, end) for buf, end in alive if end + j < len(buf) and buf[end + j] == token]
    return draft


class SuffixSession(HistorySession):
    """One verifier stream: its sequences' histories, each mirrored into a shared document."""

    def __init__(self, index: SuffixIndex, idle_timeout_s: float):
        super().__init__(idle_timeout_s)
        self._index = index
        self._docs: dict[str, tuple[int, int]] = {}  # seq id -> (doc id, tokens indexed)

    def draft(self, step: SequenceStep, history: list[int]) -> Draft:
        doc = self._mirror(step.seq_id, history, step.full_history)
        if step.max_branch <= 1:
            return Draft(step.seq_id, self._index.propose(history, step.k, doc))
        tokens, parents = self._index.propose_tree(history, step.k, doc, step.max_branch)
        return Draft(step.seq_id, tokens, parents=parents)

    def _mirror(self, seq_id: str, history: list[int], full: bool) -> int:
        """Bring the sequence's document up to its history (a new one when it diverged)."""
        doc, indexed = self._docs.get(seq_id, (None, 0))
        if doc is None or indexed > len(history) or (
                full and not self._index.holds_prefix(doc, history[:indexed])):
            doc, indexed = self._index.new_doc(), 0
        self._index.extend(doc, history[indexed:])
        self._docs[seq_id] = (doc, len(history))
        return doc

    def forget(self, seq_ids: list[str]) -> None:
        # the documents stay in the index: later requests draft from them
        for sid in seq_ids:
            self._docs.pop(sid, None)


class SuffixProposer(Proposer):
    def __init__(self, options: SuffixOptions = SuffixOptions(), max_k: int = 16,
                 idle_timeout_s: float = 600.0):
        self.index = SuffixIndex(options)
        self._max_k = max_k
        self._idle_timeout_s = idle_timeout_s

    @classmethod
    def from_config(cls, config) -> "SuffixProposer":
        return cls(SuffixOptions.parse(config.method_options()),
                   config.max_num_speculative_tokens, config.idle_timeout_s)

    def describe(self) -> ProposerDescription:
        o = self.index.options
        return ProposerDescription(method="suffix", max_num_speculative_tokens=self._max_k,
                                   model=f"suffix[depth={o.max_depth},cache={o.max_cached_tokens}]")

    def open_session(self) -> SuffixSession:
        return SuffixSession(self.index, self._idle_timeout_s)
