"""Lookahead decoding (Fu et al., 2024) as an in-target method: no draft model, no process.

Per sequence the verifier keeps a Jacobi window (N - 1 levels of W guesses, kernels/lookahead.py)
and an n-gram pool keyed by first token. Each step the sequence's draft tree is

    candidates: up to G continuations (N - 1 tokens each) from the pool whose key is the root
                token, merged into a trie                        -> verified, as any draft
    window:     the W x (N - 1) guesses as a comb of nodes whose ancestors are exactly the
                paper's 2-D mask                                 -> verified too (deterministic
                                                                    nodes: accepting a right
                                                                    guess is free)

in one target forward. The target's argmax at the window's top level is the next Jacobi level;
each column of a full window yields an N-gram for the pool, as does every N tokens the sequence
emits (so the pool also covers what prompt lookup would find). Rows the step does not accept are
freed like any rejected draft node, so the window never holds a cache block after the step.

Candidates and window nodes are deterministic (one-hot q): greedy output equals speculation off,
sampled output is the target's (the tree sampler's multi-draft rule), and seeded output is
identical on and off (the keyed coupling ignores drafts).

Memory per sequence is bounded: W x (N - 1) window tokens and at most `max_keys` pool keys of at
most G continuations each.

(W, N, G) come from the request's plan (`speculation.lookahead`, validated by the gateway) where
it gives them, else from the verifier's --lookahead-* options. The window is fed only in steps
whose node budget k holds it (W x (N - 1) nodes); a smaller k verifies pool candidates only.
"""

from __future__ import annotations

import random
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence as Seq

from kernels.lookahead import (
    advance_window,
    comb_parents,
    harvest_ngrams,
    trie_from_continuations,
)
from splitspec.params import (
    LookaheadParams,
    SamplingParams,
    SpeculationPlan,
    check_lookahead_fits,
    lookahead_step_nodes,
    lookahead_window_nodes,
)
from splitspec.proposal import Draft
from verifier_service.methods.in_target import InTargetMethod, InTargetState, StepOutcome


@dataclass(frozen=True)
class LookaheadShape:
    """(W, N, G): window width, n-gram size (the window holds N - 1 levels), guesses per step."""

    window: int = 3
    ngram: int = 3
    guesses: int = 2

    def __post_init__(self):
        if self.window < 1 or self.ngram < 2 or self.guesses < 0:
            raise ValueError(f"lookahead needs W >= 1, N >= 2, G >= 0; got {self}")

    @property
    def window_nodes(self) -> int:
        return lookahead_window_nodes(self.window, self.ngram)

    @property
    def max_nodes(self) -> int:
        """The most draft nodes one step can feed: window plus G whole candidates."""
        return lookahead_step_nodes(self.window, self.ngram, self.guesses)


class NGramPool:
    """N-grams seen by one sequence, keyed by first token: the most recent first, at most
    `per_key` continuations per key and `max_keys` keys (least recently touched key evicted)."""

    def __init__(self, n: int, per_key: int, max_keys: int = 4096):
        self.n, self.per_key, self.max_keys = n, per_key, max_keys
        self._pool: OrderedDict[int, list[tuple[int, ...]]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(v) for v in self._pool.values())

    def add(self, gram: Seq[int]) -> None:
        if len(gram) != self.n:
            return
        key, cont = int(gram[0]), tuple(int(t) for t in gram[1:])
        conts = self._pool.pop(key, [])
        if cont in conts:
            conts.remove(cont)
        conts.insert(0, cont)
        del conts[self.per_key:]
        self._pool[key] = conts
        while len(self._pool) > self.max_keys:
            self._pool.popitem(last=False)

    def add_history(self, tokens: Seq[int], start: int = 0) -> None:
        """Every N-gram of `tokens` that ends at index >= start + n - 1."""
        for i in range(max(start, 0), len(tokens) - self.n + 1):
            self.add(tokens[i:i + self.n])

    def get(self, key: int) -> list[tuple[int, ...]]:
        return list(self._pool.get(int(key), ()))


@dataclass(frozen=True)
class LookaheadDraft:
    """One step's draft tree: candidate nodes first, then the window level-major."""

    tokens: list[int]
    parents: list[int]
    num_candidates: int
    window_levels: int  # levels of the window fed this step


class LookaheadState:
    """One sequence's window and pool."""

    def __init__(self, shape: LookaheadShape, tokens: Seq[int], key: str,
                 counters: "LookaheadCounters | None" = None):
        self.shape = shape
        self.counters = counters if counters is not None else LookaheadCounters()
        self.pool = NGramPool(shape.ngram, shape.guesses)
        self.pool.add_history(tokens)
        self._seen = len(tokens)  # history already harvested into the pool
        # Guesses come from the prompt, as the paper's initialisation does; seeded by the request
        # id so a request drafts the same way every time it runs.
        self._rng = random.Random(zlib.crc32(key.encode()))
        self._source = list(tokens[-256:]) or [0]
        self.levels: list[list[int]] = [self._fill()]
        self._last: LookaheadDraft | None = None

    def _fill(self) -> list[int]:
        return [self._rng.choice(self._source) for _ in range(self.shape.window)]

    def propose(self, tokens: Seq[int], budget: int) -> LookaheadDraft:
        """The step's tree within `budget` nodes: as many candidate nodes as fit beside the
        window; the window is left out when even it does not fit."""
        levels = self.levels if budget >= len(self.levels) * self.shape.window else []
        window = [t for level in levels for t in level]
        conts = [c for c in self.pool.get(tokens[-1])][: self.shape.guesses]
        cand, cand_parents = trie_from_continuations(conts, budget - len(window))
        parents = cand_parents + comb_parents(self.shape.window, len(levels), len(cand))
        self._last = LookaheadDraft(cand + window, parents, len(cand), len(levels))
        self.counters.candidate_nodes += len(cand)
        self.counters.window_nodes += len(window)
        return self._last

    def observe(self, emitted: Seq[int], node_argmax: Seq[int], tokens: Seq[int],
                path: Seq[int] = ()) -> None:
        """After the step: `emitted` the tokens it emitted (>= 1), `node_argmax` the target's
        argmax at each node of the proposed tree (in the tree's order), `tokens` the sequence's
        history now, `path` the accepted nodes."""
        last, self._last = self._last, None
        if last is not None:
            from_pool = sum(1 for node in path if node < last.num_candidates)
            self.counters.accepted_from_pool += from_pool
            self.counters.accepted_from_window += len(path) - from_pool
        self.pool.add_history(tokens, self._seen - self.shape.ngram + 1)
        self._seen = len(tokens)
        if last is None or not last.window_levels or not emitted:
            return
        w = self.shape.window
        top = last.num_candidates + (last.window_levels - 1) * w
        outputs = list(node_argmax[top:top + w])
        if len(outputs) != w:
            return  # the step fed no logits for the window: keep it as it is
        for gram in harvest_ngrams(self.levels, outputs, self.shape.ngram):
            self.pool.add(gram)
        self.levels = advance_window(self.levels, outputs, self.shape.ngram, len(emitted),
                                     self._fill())


@dataclass
class LookaheadCounters:
    """A verifier's lookahead nodes since start: fed from the pool's candidates and from the
    window, and accepted from each."""

    candidate_nodes: int = 0
    window_nodes: int = 0
    accepted_from_pool: int = 0
    accepted_from_window: int = 0


class LookaheadMethod(InTargetMethod):
    """The registry's `lookahead`: one per verifier, a LookaheadState per running sequence, shaped
    by its plan (W, N, G) or the deployment's defaults."""

    def __init__(self, default: LookaheadShape = LookaheadShape()):
        self.default = default
        self.counters = LookaheadCounters()
        self._live: dict[str, LookaheadState] = {}  # running sequences' states, by request id

    def shape(self, plan: SpeculationPlan) -> LookaheadShape:
        """The plan's (W, N, G), each unset one the verifier's default."""
        asked, d = plan.lookahead, self.default
        if asked is None:
            return d
        return LookaheadShape(d.window if asked.window is None else asked.window,
                              d.ngram if asked.ngram is None else asked.ngram,
                              d.guesses if asked.guesses is None else asked.guesses)

    def check_plan(self, plan: SpeculationPlan, max_k: int) -> None:
        shape = self.shape(plan)
        check_lookahead_fits(LookaheadParams(shape.window, shape.ngram, shape.guesses), max_k)

    def stats(self) -> dict[str, float]:
        live = list(self._live.values())
        c = self.counters
        return {"candidate_nodes_total": c.candidate_nodes, "window_nodes_total": c.window_nodes,
                "accepted_from_pool_total": c.accepted_from_pool,
                "accepted_from_window_total": c.accepted_from_window,
                "sequences": len(live), "pool_ngrams": sum(len(s.pool) for s in live)}

    @classmethod
    def from_verifier(cls, vocab_size: int, config=None) -> "LookaheadMethod":
        if config is None:
            return cls()
        return cls(LookaheadShape(config.lookahead_window, config.lookahead_ngram,
                                  config.lookahead_guesses))

    def admit(self, request_id: str, tokens: Seq[int], sampling: SamplingParams,
              plan: SpeculationPlan) -> "LookaheadSequence":
        state = LookaheadState(self.shape(plan), tokens, request_id, self.counters)
        self._live[request_id] = state
        return LookaheadSequence(request_id, state, self._live)


class LookaheadSequence(InTargetState):
    """The in-target seam's view of one sequence's LookaheadState."""

    def __init__(self, request_id: str, state: LookaheadState,
                 live: dict[str, LookaheadState] | None = None):
        self.request_id, self.state, self._live = request_id, state, live

    def propose(self, tokens: Seq[int], k: int) -> Draft:
        d = self.state.propose(tokens, k)
        return Draft(self.request_id, d.tokens, parents=d.parents)

    def observe(self, outcome: StepOutcome) -> None:
        self.state.observe(outcome.emitted, outcome.node_argmax, outcome.history, outcome.path)

    def free(self) -> None:
        if self._live is not None and self._live.get(self.request_id) is self.state:
            del self._live[self.request_id]
        self.state = None
