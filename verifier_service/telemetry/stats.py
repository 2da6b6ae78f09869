"""What the engine measures, as plain dataclasses, kept apart from any exporter.

Three kinds of record:
  * `EngineStats`: counters since start (monotonic) plus gauges filled in by Engine.snapshot();
    streamed by Verifier/WatchStats (operators, tests, and the gateway's speculation policy:
    acceptance per method for greedy and sampled requests, proposer round trips, step time by
    batch tokens).
  * `StepStats`: one engine step (its duration, batch size, per-method drafting outcome),
    handed to every `EngineObserver` when the step ends.
  * `RequestTimeline`: one request's life (arrival, admission, first token, finish, per-step
    records), handed to observers when the request ends; tracing turns it into spans.
Observers run on the engine's event loop between steps: they must be cheap and never raise.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass, field
from typing import Protocol

from splitspec.goodput import (
    STEP_KINDS,
    Acceptance,
    MethodCounts,
    ReplicaLoad,
    seqs_class,
    tried_positions,
)

# Upper bounds of the step-cost buckets (batch tokens); beyond the last: one more bucket.
STEP_COST_BOUNDS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024,
                    2048, 4096)


def count_accepted(per_position: list[int], k: int, accepted: int) -> None:
    """Add one verified draft of k tokens, `accepted` of them accepted, to per-position counts
    (per_position[j]: drafts whose token j+1 was accepted; grown to k entries)."""
    if len(per_position) < k:
        per_position.extend([0] * (k - len(per_position)))
    for j in range(accepted):
        per_position[j] += 1


@dataclass
class AcceptanceCounts:
    """Verified drafts of one kind of request (greedy or sampled), counters."""

    drafts: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    rejections: int = 0  # drafts with a rejected token
    asked: int = 0  # sequence-steps that asked the method for a draft, answered or not
    # Per draft position j (entry j - 1), over the verified steps that had asked: asked for at
    # least j tokens; of those, a draft with a j-th token; of those, its first j accepted.
    asked_at: list[int] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    def add(self, k: int, accepted: int) -> None:
        self.drafts += 1
        self.proposed_tokens += k
        self.accepted_tokens += accepted
        self.rejections += tried_positions(k, accepted) - accepted

    def add_asked(self, asked_k: int, drafted: int, accepted: int) -> None:
        """One verified step of a sequence that asked for asked_k tokens and got a draft of
        `drafted` (0: none), `accepted` of them accepted."""
        for counts, n in ((self.asked_at, asked_k), (self.drafted_at, min(drafted, asked_k)),
                          (self.accepted_at, min(accepted, drafted, asked_k))):
            count_accepted(counts, n, n)  # one more at each of the first n positions


@dataclass
class TreeCounts:
    """Verified steps of requests that allowed token trees of up to b children per node."""

    greedy: AcceptanceCounts = field(default_factory=AcceptanceCounts)
    sampled: AcceptanceCounts = field(default_factory=AcceptanceCounts)


@dataclass
class StepCostBucket:
    max_tokens: int  # batch tokens in (previous bucket's max_tokens, max_tokens]
    kind: str = "greedy"  # the kind of step (splitspec.goodput.STEP_KINDS)
    steps: int = 0
    tokens_total: int = 0
    seconds_total: float = 0.0
    max_seqs: int = 0  # its steps' class of sequence counts (goodput.seqs_class); 0: any
    method: str = ""  # the one method its steps' sequences were planned with; "": any


@dataclass
class MethodStats:
    """Counters per proposer method (monotonic)."""

    proposed_tokens: int = 0  # draft tokens verified
    accepted_tokens: int = 0
    drafts: int = 0  # sequence-steps that verified a non-empty draft
    steps: int = 0  # steps that asked this method
    missed_steps: int = 0  # asked, but no usable answer before the deadline
    # why the method gets no drafts right now ("" when it does): proposer_unavailable (not
    # connected) or proposer_incompatible (its vocabulary or tokenizer differs from the target's)
    unavailable: str = ""
    # accepted_per_position[j]: drafts whose token j+1 was accepted (sums to accepted_tokens)
    accepted_per_position: list[int] = field(default_factory=list)
    greedy: AcceptanceCounts = field(default_factory=AcceptanceCounts)
    sampled: AcceptanceCounts = field(default_factory=AcceptanceCounts)
    # answers received in time, by the largest k the call asked for: k -> [calls, seconds]
    round_trips: dict[int, list] = field(default_factory=dict)
    # the same by (k, class of the sequences asked: goodput.seqs_class)
    round_trips_by_seqs: dict[tuple[int, int], list] = field(default_factory=dict)
    # drafting ahead: drafts answered from the proposer's drafting ahead, and drafts it had drafted
    # ahead for other outcomes (drafted afresh); hit rate = hits / (hits + misses)
    ahead_hits: int = 0
    ahead_misses: int = 0
    ahead_pushed: int = 0  # of the hits: taken from a push, no round trip waited for
    # token trees: children per node allowed (b > 1) -> what those requests' steps verified
    trees: dict[int, TreeCounts] = field(default_factory=dict)
    # [sequence-steps, seconds] of work the method costs each of its sequences every step
    # whatever k: an in-target head learning from the verified step (an EAGLE head's advance),
    # which a sequence whose drafting pauses still pays (it is in round_trips too)
    standing: list = field(default_factory=lambda: [0, 0.0])

    def kind(self, greedy: bool, branches: int = 1) -> AcceptanceCounts:
        """The counters of one kind of request: greedy or sampled, chains or trees of b."""
        if branches <= 1:
            return self.greedy if greedy else self.sampled
        tree = self.trees.setdefault(branches, TreeCounts())
        return tree.greedy if greedy else tree.sampled

    def add_draft(self, k: int, accepted: int, greedy: bool = True, branches: int = 1) -> None:
        """A verified draft of k tokens (a tree: k nodes, `accepted` its accepted depth)."""
        self.drafts += 1
        self.proposed_tokens += k
        self.accepted_tokens += accepted
        count_accepted(self.accepted_per_position, k, accepted)
        self.kind(greedy, branches).add(k, accepted)

    def counts(self) -> MethodCounts:
        """What the goodput model reads of these counters (the gateway reads the same from
        WatchStats)."""
        return MethodCounts(Acceptance.from_counters(self.greedy),
                            Acceptance.from_counters(self.sampled),
                            tuple((k, n, s) for k, (n, s) in self.round_trips.items()),
                            len(self.accepted_per_position),
                            tuple((b, Acceptance.from_counters(t.greedy),
                                   Acceptance.from_counters(t.sampled))
                                  for b, t in sorted(self.trees.items())),
                            tuple((k, c, n, s) for (k, c), (n, s) in
                                  self.round_trips_by_seqs.items()))

    def add_standing(self, seconds: float, sequences: int = 1) -> None:
        """`seconds` of such work for `sequences` sequence-steps together."""
        self.standing[0] += sequences
        self.standing[1] += seconds

    def standing_seconds(self) -> float:
        """Mean seconds a step of one of its sequences costs whatever k (0: none known)."""
        n, seconds = self.standing
        return seconds / n if n else 0.0

    def add_round_trip(self, k: int, seconds: float, seqs: int = 0) -> None:
        """An answer for a step that asked `seqs` sequences (0: not known) for up to k tokens:
        `seconds` its time (an in-target method's: each sequence's share)."""
        entries = [self.round_trips.setdefault(k, [0, 0.0])]
        if seqs > 0:
            entries.append(self.round_trips_by_seqs.setdefault((k, seqs_class(seqs)), [0, 0.0]))
        for entry in entries:
            entry[0] += 1
            entry[1] += seconds


@dataclass
class EngineStats(ReplicaLoad):
    """Counters since start (monotonic) plus gauges filled in by Engine.snapshot(): the load
    (ReplicaLoad's running, waiting, max_num_seqs) and the KV cache's blocks."""

    steps: int = 0
    generated_tokens: int = 0
    finished_requests: int = 0
    aborted_requests: int = 0
    per_method: dict[str, MethodStats] = field(default_factory=dict)
    preemptions: int = 0
    step_seconds_total: float = 0.0
    kv_blocks_total: int = 0
    kv_blocks_free: int = 0  # cached blocks no sequence holds count as free
    # prefix caching (verifier_service/batching/prefix_cache.py): prompt tokens looked up at
    # admission and found cached, blocks the cache names, cached blocks evicted
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_blocks: int = 0
    prefix_cache_evictions: int = 0
    # structured outputs: draft nodes pruned before the step because the request's grammar
    # forbids them (with their subtrees; each would have been rejected for certain)
    grammar_pruned_tokens: int = 0
    # structured requests admitted, by kind (json_object, json_schema, regex, choice, grammar);
    # their grammars compiled (cache misses), the seconds those compilations took, and the
    # requests whose grammar was found compiled (or compiling) in the cache
    structured_requests: dict[str, int] = field(default_factory=dict)
    grammar_compiles: int = 0
    grammar_compile_seconds: float = 0.0
    grammar_cache_hits: int = 0
    # in-target methods' own counters and gauges (InTargetMethod.stats), by method
    in_target: dict[str, dict[str, float]] = field(default_factory=dict)
    # how steps ran: replayed graphs or eager, and why (verifier_service/step/executor.py)
    executor: object = None  # ExecutorStats
    # decoding steps' time without the wait for proposers, by kind of step (greedy, sampled,
    # tree: splitspec.goodput.step_kind) and batch tokens (STEP_COST_BOUNDS)
    step_cost: list[StepCostBucket] = field(default_factory=lambda: [
        StepCostBucket(b, kind) for kind in STEP_KINDS for b in (*STEP_COST_BOUNDS, 2 ** 31 - 1)])
    # the same, kept apart by the steps' class of sequence counts (goodput.seqs_class):
    # (kind, class, max_tokens) -> its bucket, made on the first such step
    step_cost_by_seqs: dict[tuple[str, int, int], StepCostBucket] = field(default_factory=dict)
    # the same, kept apart by the one method every sequence of the step was planned with
    # ("off": none speculates; a step of several methods is in none of these):
    # (method, kind, class, max_tokens) -> its bucket. What a method costs a step beside its
    # draft rows (its proposer's process drafting ahead beside the forward, an in-target
    # drafter's work) is its own, not its kind's
    step_cost_by_method: dict[tuple[str, str, int, int], StepCostBucket] = field(
        default_factory=dict)

    def method(self, name: str) -> MethodStats:
        return self.per_method.setdefault(name, MethodStats())

    def reset(self) -> None:
        """Back to a fresh start, in place (every holder of this object sees it): what the
        warm-up's requests counted is no measurement of served traffic."""
        for f in dataclasses.fields(self):
            if f.name != "max_num_seqs":
                setattr(self, f.name, f.default_factory() if f.default_factory
                        is not dataclasses.MISSING else f.default)

    def add_step_cost(self, tokens: int, seconds: float, kind: str = "greedy",
                      seqs: int = 0, method: str = "") -> None:
        """A decoding step of `tokens` batch tokens over `seqs` sequences (0: not known), all
        planned with `method` ("off": none speculates; "": several methods, or not known)."""
        per_kind = len(STEP_COST_BOUNDS) + 1
        at = bisect.bisect_left(STEP_COST_BOUNDS, tokens)
        buckets = [self.step_cost[STEP_KINDS.index(kind) * per_kind + at]]
        if seqs > 0:
            key = (kind, seqs_class(seqs), buckets[0].max_tokens)
            if key not in self.step_cost_by_seqs:
                self.step_cost_by_seqs[key] = StepCostBucket(key[2], kind, max_seqs=key[1])
            buckets.append(self.step_cost_by_seqs[key])
            if method:
                mkey = (method, *key)
                if mkey not in self.step_cost_by_method:
                    self.step_cost_by_method[mkey] = StepCostBucket(key[2], kind, max_seqs=key[1],
                                                                    method=method)
                buckets.append(self.step_cost_by_method[mkey])
        for bucket in buckets:
            bucket.steps += 1
            bucket.tokens_total += tokens
            bucket.seconds_total += seconds


@dataclass
class MethodStepStats:
    """One method's share of one step."""

    proposed_tokens: int = 0
    accepted_tokens: int = 0
    drafts: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    round_trip_s: float | None = None  # None: not asked, or no answer
    missed: bool = False  # asked, but no usable answer before the deadline (or not connected)
    garbage: int = 0  # drafts dropped as untrustworthy (wrong length, ids, or q)
    ahead: bool = False  # the proposer was asked to draft ahead this step
    ahead_hits: int = 0  # answered from drafting ahead
    ahead_misses: int = 0  # drafted ahead for other outcomes: drafted afresh
    ahead_pushed: int = 0  # of the hits: taken from a push (no round trip)
    resyncs: int = 0  # sequences the proposer asked to resend in full
    branch_hits: int = 0  # token trees: drafts whose accepted path left a first-ranked child

    def add_draft(self, k: int, accepted: int, branch_hit: bool = False) -> None:
        self.drafts += 1
        self.branch_hits += branch_hit
        self.proposed_tokens += k
        self.accepted_tokens += accepted
        count_accepted(self.accepted_per_position, k, accepted)


@dataclass
class StepStats:
    """One engine step, as observers see it."""

    start: float  # time.time() at the step's start (wall clock, for spans)
    seconds: float  # its duration (perf_counter)
    num_seqs: int  # sequences in the batch
    num_tokens: int  # tokens forwarded (uncached + drafts)
    emitted_tokens: int
    per_method: dict[str, MethodStepStats] = field(default_factory=dict)
    draft_seconds: float = 0.0  # of `seconds`, the wait for proposers' answers
    prefill_tokens: int = 0  # of `num_tokens`, prompt tokens of sequences still prefilling
    kind: str = "greedy"  # what it ran beside the forward (splitspec.goodput.step_kind)
    # the one speculation method its sequences were planned with ("off": none; "": several)
    method: str = ""


@dataclass
class StepRecord:
    """One step of one request."""

    start: float  # time.time()
    end: float
    k: int  # draft tokens verified (0: none this step)
    accepted: int
    prefill_tokens: int  # uncached prompt tokens fed this step (0 when decoding)
    round_trip_s: float | None = None  # its proposer's answer time, when asked


@dataclass
class RequestTimeline:
    """One request's life, for traces and latency histograms (wall clock, time.time())."""

    request_id: str
    method: str | None
    arrival: float
    admitted: float | None = None  # first scheduled
    first_token: float | None = None
    finished: float | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    steps: list[StepRecord] = field(default_factory=list)


class EngineObserver(Protocol):
    def on_step(self, step: StepStats) -> None: ...

    def on_request_done(self, timeline: RequestTimeline) -> None: ...
