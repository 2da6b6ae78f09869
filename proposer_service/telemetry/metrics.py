"""A proposer's Prometheus exporter: what it was asked and what it answered, per method.

Counters add to plain integers on the stream's task; the collector reads them at scrape time.
Proposer-side time per message is a histogram; the verifier measures the round trip
(splitspec_spec_decode_proposer_round_trip_seconds), which adds the network and queueing.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client import CollectorRegistry, Histogram

from splitspec.proposal import AHEAD_HIT, AHEAD_MISS, Draft
from splitspec.telemetry.metrics import STEP_BUCKETS, counter, gauge, with_old_name


class ProposerMetrics:
    def __init__(self, registry: CollectorRegistry, method: str):
        self.method = method
        self.messages = 0
        self.sequences = 0
        self.proposed_tokens = 0
        self.resyncs = 0
        self.released = 0
        self.ahead_hits = 0  # drafts answered from drafting ahead
        self.ahead_misses = 0  # drafted ahead for other outcomes: drafted afresh
        self.streams = 0  # open Propose streams (one per connected verifier)
        self.fallbacks = None  # the proposer's EagerFallbacks, where it captures graphs
        self._seconds = Histogram(
            "splitspec_proposer_propose_seconds",
            "Time a proposer took to answer one Propose message (all its sequences)",
            ["method"], buckets=STEP_BUCKETS, registry=registry).labels(method)
        registry.register(self)

    def on_message(self, sequences: int, drafts: list[Draft], seconds: float,
                   answered: bool = True) -> None:
        """answered=False: an outcome-only message (the verifier took pushed drafts): counted,
        but its time is not an answer anyone waited for."""
        self.messages += 1
        self.sequences += sequences
        for d in drafts:
            self.proposed_tokens += len(d.tokens)
            if d.resync:
                self.resyncs += 1
            self.ahead_hits += d.ahead_outcome == AHEAD_HIT
            self.ahead_misses += d.ahead_outcome == AHEAD_MISS
        if answered:
            self._seconds.observe(seconds)

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        m = (self.method,)
        yield counter("splitspec_proposer_propose_messages",
                      "Propose messages answered (one per verifier step that asked)",
                      ["method"], [(m, self.messages)])
        yield counter("splitspec_proposer_sequences", "Sequences drafted for, over all messages",
                      ["method"], [(m, self.sequences)])
        yield from with_old_name(counter("splitspec_proposer_proposed_tokens",
                      "Draft tokens sent (the verifier may drop late or invalid ones)",
                      ["method"], [(m, self.proposed_tokens)]), "splitspec_proposer_draft_tokens")
        yield counter("splitspec_proposer_resyncs",
                      "Sequences answered with RESYNC: state lost or inconsistent, history "
                      "needed", ["method"], [(m, self.resyncs)])
        yield from with_old_name(counter("splitspec_proposer_ahead_hits",
                      "Drafts answered from drafting ahead while the verifier verified "
                      "(drafting ahead); hit rate = hits / (hits + misses)", ["method"],
                      [(m, self.ahead_hits)]), "splitspec_proposer_precompute_hits")
        yield from with_old_name(counter("splitspec_proposer_ahead_misses",
                      "Drafts drafted afresh: the outcome was not among those drafted ahead",
                      ["method"], [(m, self.ahead_misses)]), "splitspec_proposer_precompute_misses")
        yield counter("splitspec_proposer_released_sequences",
                      "Sequences the verifier said ended", ["method"], [(m, self.released)])
        if self.fallbacks is not None:
            yield counter("splitspec_proposer_eager_fallbacks",
                          "Drafting batches a device that captures graphs ran eagerly, by "
                          "reason (batch, width, k, context: outside the captured shapes; "
                          "not_captured; tree)", ["method", "reason"],
                          [((self.method, reason), n)
                           for reason, n in list(self.fallbacks.counts.items())])
        yield gauge("splitspec_proposer_streams", "Open Propose streams (connected verifiers)",
                    labels=["method"], samples=[(m, self.streams)])
