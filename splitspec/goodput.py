"""The goodput model behind the `auto` speculation policy: pure functions, no I/O.

Its one home: the verifier's counters become acceptance here (`Acceptance.from_counters`, for
the engine's counters and their WatchStats protobuf alike; `MethodCounts` for one method),
acceptance becomes a method's model (`MethodModel.from_acceptance`), and draft limits and the
step-cost curve are fitted here; the gateway's per-request choice (gateway/policy.py) and the
verifier's per-step k (verifier_service/drafts/adaptive_k.py) both read the model through these.

Goodput is output tokens per second of verifier time (SmartSpec, "Optimizing Speculative
Decoding for Serving LLMs Using Goodput"). For a draft of k tokens whose tokens are each
accepted with probability a until the first rejection (Leviathan et al.), a step emits

    E[tokens](a, k) = (1 - a^(k+1)) / (1 - a)          (k + 1 when a = 1; 1 when k = 0)

and costs the verifier's step time at the batch's token count plus the proposer's round trip
(the engine waits for drafts before it verifies). A proposer that finds no draft for a share
1 - h of the steps (prompt lookup without a match, a late answer) emits 1 + h (E - 1). Both
the gateway (per request) and the verifier (per sequence and step) pick the (method, k),
k = 0 meaning off, with the highest goodput. docs/policy.md has the constants and a worked example.

Acceptance is estimated with the usual model's maximum-likelihood estimate: of the draft
positions that were tried (accepted tokens plus one rejected token per draft that was not
accepted in full), the share accepted, shrunk towards a prior while there is little data.
The round trip is fitted as base + per_token * k from its mean per k asked.

Per draft position the counts are also measured directly: of the sequence-steps that asked for
at least j tokens, how many drafts had a j-th token (a row the verifier forwards) and how many
had their first j tokens accepted (a token gained). A proposer does not always draft what it
is asked for (prompt lookup and suffix decoding stop where their match ends), and its long
drafts are not its average ones (a long suffix match is a confident one): the geometric model
above prices neither. The measured shares, shrunk towards that model while a position has
little data, are what a step asking for k tokens forwards and gains (`MethodModel.positions`),
and its time is the step time taken over the rows its draft really has, none to k, each with
its measured share, not the step time at their mean (`MethodModel.step_seconds`).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Mapping

# The verifier's step time before any step was measured: seconds = BASE + PER_TOKEN * tokens.
DEFAULT_BASE_S = 0.010
DEFAULT_PER_TOKEN_S = 0.0005
# A bucket of step times counts once it has this many steps.
MIN_BUCKET_STEPS = 3
# Acceptance prior: optimistic, so that a method without data gets tried, and weighted as this
# many tried draft positions, so that a few drafts outweigh it.
PRIOR_ACCEPTANCE = 0.7
PRIOR_STRENGTH = 20.0
# Share of asked steps that get a draft, before data: optimistic too, weighted as 10 asks.
PRIOR_HIT_RATE = 1.0
PRIOR_HIT_STRENGTH = 10.0
# A proposer's round trip before any was timed.
DEFAULT_ROUND_TRIP_S = 0.002
# answers a class of sequence counts needs before its own round-trip fit is used
MIN_CLASS_CALLS = 8
# A proposer that never drafted more than n tokens in this many drafts, although asked for
# more, is taken to draft at most n.
MIN_DRAFTS_FOR_LIMIT = 20
# Speculation must beat plain decoding by this share of goodput: estimates are noisy and a
# draft costs proposer capacity and KV slots that the model does not count.
SPECULATION_MARGIN = 0.03


def expected_tokens(a: float, k: int) -> float:
    """Tokens one step emits for a k-token draft with per-token acceptance a."""
    if k <= 0:
        return 1.0
    a = min(max(a, 0.0), 1.0)
    if a >= 1.0 - 1e-12:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def _per_position(a: tuple[float, ...], b: tuple[float, ...], op) -> tuple[float, ...]:
    """op applied position by position, the shorter tuple read as zeros where it ends."""
    n = max(len(a), len(b))
    return tuple(op(a[i] if i < len(a) else 0.0, b[i] if i < len(b) else 0.0) for i in range(n))


def _add(x: float, y: float) -> float:
    return x + y


def _sub(x: float, y: float) -> float:
    return max(x - y, 0.0)


@dataclass(frozen=True)
class Acceptance:
    """Draft positions tried and accepted (counts; may be decayed, hence floats)."""

    accepted: float = 0.0
    tried: float = 0.0  # accepted + one per draft with a rejection
    drafts: float = 0.0  # non-empty drafts verified
    asked: float = 0.0  # sequence-steps that asked for one
    # Per draft position j (entry j - 1): sequence-steps that asked for at least j tokens, of
    # those the drafts that had a j-th token, and of those the drafts whose first j tokens
    # were all accepted.
    asked_at: tuple[float, ...] = ()
    drafted_at: tuple[float, ...] = ()
    accepted_at: tuple[float, ...] = ()

    @classmethod
    def from_counts(cls, accepted: float, rejections: float, drafts: float = 0.0,
                    asked: float = 0.0, asked_at: Iterable[float] = (),
                    drafted_at: Iterable[float] = (),
                    accepted_at: Iterable[float] = ()) -> "Acceptance":
        """From counters of verified drafts: each draft with a rejection tried one position
        beyond its accepted ones (`tried_positions`)."""
        return cls(float(accepted), float(accepted + rejections), float(drafts), float(asked),
                   tuple(map(float, asked_at)), tuple(map(float, drafted_at)),
                   tuple(map(float, accepted_at)))

    @classmethod
    def from_counters(cls, counts) -> "Acceptance":
        """From one kind of request's counters as the verifier keeps and streams them: its
        `telemetry.stats.AcceptanceCounts`, or their protobuf (the same field names)."""
        return cls.from_counts(counts.accepted_tokens, counts.rejections, counts.drafts,
                               counts.asked, counts.asked_at, counts.drafted_at,
                               counts.accepted_at)

    def rate(self, prior: float = PRIOR_ACCEPTANCE, strength: float = PRIOR_STRENGTH) -> float:
        return (self.accepted + prior * strength) / (self.tried + strength)

    def hit_rate(self, prior: float = PRIOR_HIT_RATE,
                 strength: float = PRIOR_HIT_STRENGTH) -> float:
        return min((self.drafts + prior * strength) / (self.asked + strength), 1.0)

    def positions(self, acceptance: float, hit_rate: float,
                  strength: float = PRIOR_HIT_STRENGTH) -> tuple[tuple[float, float], ...]:
        """Per position j with data: (rows, gain), the shares of the steps asking for at least
        j tokens whose draft had a j-th token and whose first j tokens were accepted, each
        shrunk towards the geometric model (hit_rate, hit_rate * acceptance^j) with the weight
        of `strength` asks."""
        out = []
        for j, (n, d, acc) in enumerate(zip(self.asked_at, self.drafted_at, self.accepted_at), 1):
            rows = min((d + hit_rate * strength) / (n + strength), 1.0)
            gain = min((acc + hit_rate * acceptance ** j * strength) / (n + strength), rows)
            out.append((rows, gain))
        return tuple(out)

    def plus(self, other: "Acceptance") -> "Acceptance":
        return Acceptance(self.accepted + other.accepted, self.tried + other.tried,
                          self.drafts + other.drafts, self.asked + other.asked,
                          _per_position(self.asked_at, other.asked_at, _add),
                          _per_position(self.drafted_at, other.drafted_at, _add),
                          _per_position(self.accepted_at, other.accepted_at, _add))

    def minus(self, other: "Acceptance") -> "Acceptance":
        """The counts since `other` (never negative)."""
        return Acceptance(_sub(self.accepted, other.accepted), _sub(self.tried, other.tried),
                          _sub(self.drafts, other.drafts), _sub(self.asked, other.asked),
                          _per_position(self.asked_at, other.asked_at, _sub),
                          _per_position(self.drafted_at, other.drafted_at, _sub),
                          _per_position(self.accepted_at, other.accepted_at, _sub))

    def scaled(self, factor: float) -> "Acceptance":
        return Acceptance(self.accepted * factor, self.tried * factor, self.drafts * factor,
                          self.asked * factor, tuple(x * factor for x in self.asked_at),
                          tuple(x * factor for x in self.drafted_at),
                          tuple(x * factor for x in self.accepted_at))


@dataclass(frozen=True)
class RoundTrip:
    """A proposer's answer time for a k-token draft: base + per_token * k. `per_sequence`: the
    time is each drafting sequence's share (an in-target method drafts inside the verifier, so
    a batch waits for all of its sequences' drafting: one after another, or batched with a cost
    that still grows with the batch; measured as the step's drafting time over its sequences),
    not one call's for the whole batch (a proposer service answers a step's sequences
    together)."""

    base_s: float = DEFAULT_ROUND_TRIP_S
    per_token_s: float = 0.0
    per_sequence: bool = False

    def __call__(self, k: int) -> float:
        return self.base_s + self.per_token_s * k if k > 0 else 0.0


def fit_round_trip(points: Iterable[tuple[int, float, float]],
                   per_sequence: bool = False) -> RoundTrip:
    """RoundTrip from (k, calls, seconds total) per k: weighted least squares of the mean, base
    and slope kept >= 0. One k only: half of it taken as fixed, half as growing with k.
    per_sequence: the points are each sequence's own drafting time (in-target methods)."""
    pts = [(float(k), n, s / n) for k, n, s in points if n > 0 and k > 0]
    if not pts:
        return RoundTrip(per_sequence=per_sequence)
    w = sum(n for _, n, _ in pts)
    mx = sum(n * x for x, n, _ in pts) / w
    my = sum(n * y for _, n, y in pts) / w
    sxx = sum(n * (x - mx) ** 2 for x, n, _ in pts)
    if sxx <= 1e-12:
        return RoundTrip(my / 2, my / 2 / mx, per_sequence)
    slope = max(sum(n * (x - mx) * (y - my) for x, n, y in pts) / sxx, 0.0)
    base = my - slope * mx
    if base < 0:
        base, slope = 0.0, my / mx
    return RoundTrip(base, slope, per_sequence)


@dataclass(frozen=True)
class MethodModel:
    """What the model knows about one proposer for one kind of request."""

    acceptance: float  # per draft token
    hit_rate: float = 1.0  # share of asked steps that get a draft
    round_trip: RoundTrip = RoundTrip()
    max_draft: int = 0  # the most tokens it drafts whatever k is asked (0: no known limit)
    # Per draft position j (entry j - 1), measured (Acceptance.positions): the share of steps
    # asking for at least j tokens that forward a j-th draft token, and that gain it. Beyond
    # the measured positions a draft goes on as the last one did, each token accepted with
    # `acceptance`; with none measured that is the geometric model.
    positions: tuple[tuple[float, float], ...] = ()

    @classmethod
    def from_acceptance(cls, acceptance: Acceptance, round_trip: RoundTrip = RoundTrip(),
                        max_draft: int = 0) -> "MethodModel":
        """The model of a method's measured acceptance: its rate and hit rate shrunk towards
        the priors, and its positions shrunk towards the geometric model of those."""
        a, h = acceptance.rate(), acceptance.hit_rate()
        return cls(a, h, round_trip, max_draft, acceptance.positions(a, h))

    def drafted(self, k: int) -> int:
        return min(k, self.max_draft) if self.max_draft else k

    def per_position(self, k: int) -> list[tuple[float, float]]:
        """(rows, gain) of positions 1 .. k when k tokens are asked for."""
        a = min(max(self.acceptance, 0.0), 1.0)
        out, rows, gain = [], self.hit_rate, self.hit_rate
        for j in range(1, self.drafted(k) + 1):
            if j <= len(self.positions):
                rows, gain = self.positions[j - 1]
            else:
                gain *= a
            out.append((rows, gain))
        return out

    def _sums(self, k: int) -> tuple[float, float]:
        """(rows, gain) summed over the positions a k-token ask drafts; the running sums are
        computed once per model (the verifier asks for every k of every sequence each step)."""
        n = self.drafted(k)
        sums = self.__dict__.get("_running_sums")
        if sums is None or len(sums) <= n:
            sums = [(0.0, 0.0)]
            for rows, gain in self.per_position(max(n, 16)):
                sums.append((sums[-1][0] + rows, sums[-1][1] + gain))
            object.__setattr__(self, "_running_sums", sums)  # a cache, not a field
        return sums[n]

    def expected(self, k: int) -> float:
        """Tokens a step emits when k tokens are asked for: the target's own token, plus each
        draft token that is there and accepted together with all before it."""
        return 1.0 + self._sums(k)[1]

    def tokens(self, k: int) -> float:
        """Tokens the verifier forwards for it: the last token plus the draft when there is one."""
        return 1.0 + self._sums(k)[0]

    def step_seconds(self, k_max: int, cost: "StepCost", others_tokens: float = 0.0
                     ) -> list[float]:
        """Per k in 0 .. k_max: the expected time of a step in which it asks for k tokens and
        the rest of the batch forwards `others_tokens`, over how many rows its draft has: none
        (1 - rows_1), exactly j (rows_j - rows_j+1) or all it drafts (rows_n), each share
        measured (per_position). A step's cost is not linear in its rows (on a CPU the matrix
        kernels work in tiles of rows: 6 rows cost about what 1 does, 7 a third more), and a
        proposer that drafts either nothing or all it is asked for (prompt lookup) forwards
        each of them, never its mean: priced at the mean, its 8-token drafts looked as cheap
        as 6 rows while a third of its steps paid for 9."""
        rows = [r for r, _ in self.per_position(k_max)]
        at = [cost(others_tokens + 1.0 + j) for j in range(len(rows) + 1)]
        out, fewer, reach = [at[0]], 0.0, 1.0  # fewer: the steps stopping before row j
        for j, r in enumerate(rows, 1):
            r = min(r, reach)  # a share of drafts reaching row j never exceeds row j - 1's
            fewer += (reach - r) * at[j - 1]
            out.append(fewer + r * at[j])
            reach = r
        out += [out[-1]] * (k_max + 1 - len(out))  # asked beyond what it drafts
        return out

    def for_request(self, acceptance: float, hit_rate: float) -> "MethodModel":
        """The model of one request of this method whose own (shrunk) acceptance and hit rate
        are given: the measured rows scaled by its hit rate relative to the method's, and the
        measured acceptance of each position given the ones before it moved by its acceptance
        relative to the method's, as odds (`shift_odds`).

        Odds keep a probability a probability: a request a little better than its method
        accepts each position a little more often, never surely. Scaling the positions' gains by
        (own / method)^j instead would price a request at 0.8 against a method at 0.65 as
        accepting every token of an 8-token draft (1.23^8 = 5.3 times the measured gain, capped
        only by the rows), so every step would ask for the most tokens it may. Where the
        positions are geometric (position j accepted with the method's acceptance given the
        ones before it) both give the request's own acceptance per position."""
        h = hit_rate / self.hit_rate if self.hit_rate > 0 else 1.0
        positions, theirs, mine = [], 1.0, 1.0
        for rows, gain in self.positions:
            # the share of drafts forwarding this position whose tokens up to it are accepted
            accepted = min(gain / rows, 1.0) if rows > 0 else 0.0
            given = accepted / theirs if theirs > 0 else 0.0  # accepted, given the ones before
            mine *= shift_odds(given, self.acceptance, acceptance)
            theirs = accepted
            rows = min(rows * h, 1.0)
            positions.append((rows, rows * min(mine, 1.0)))
        return dataclasses.replace(self, acceptance=acceptance, hit_rate=hit_rate,
                                   positions=tuple(positions))


def shift_odds(p: float, reference: float, target: float) -> float:
    """p with its odds multiplied by those of target over those of reference: p itself when
    target == reference, target when p == reference, 0 or 1 when target is; p unchanged
    where it is no probability below 1 (a conditional share above 1, long drafts being
    confident ones)."""
    if p >= 1.0 or p <= 0.0:
        return p
    eps = 1e-9
    reference = min(max(reference, eps), 1.0 - eps)
    if target >= 1.0:
        return 1.0
    if target <= 0.0:
        return 0.0
    odds = p / (1.0 - p) * (target / (1.0 - target)) / (reference / (1.0 - reference))
    return odds / (1.0 + odds)


def draft_limit(longest_draft: int, largest_asked: int, drafts: float,
                min_drafts: float = MIN_DRAFTS_FOR_LIMIT) -> int:
    """A proposer's own limit on draft length (e.g. an MLP speculator's heads), once it was
    asked for more than it ever drafted often enough to tell; 0: no known limit.
    longest_draft: the most tokens one verified draft had; largest_asked: the largest k of its
    timed round trips; drafts: verified drafts, greedy and sampled together."""
    if drafts >= min_drafts and 0 < longest_draft < largest_asked:
        return longest_draft
    return 0


@dataclass
class ReplicaLoad:
    """A verifier replica's load as it reports it (Verifier/WatchStats): the sequences in its
    running batch, those waiting for admission and its batch limit. The engine keeps its own
    up to date (verifier_service/telemetry/stats.py, EngineStats); the gateway reads each
    replica's from its snapshots (gateway/estimates.py, ReplicaSnapshot)."""

    running: int = 0
    waiting: int = 0
    max_num_seqs: int = 0


@dataclass(frozen=True)
class MethodCounts:
    """What the verifier counted of one proposer method since it started, as its per-step k
    (verifier_service/drafts/adaptive_k.py) and the gateway's policy (gateway/estimates.py, from
    WatchStats) both read it."""

    greedy: Acceptance = Acceptance()
    sampled: Acceptance = Acceptance()
    # (k, calls, seconds total) per k; an in-target method's per drafting sequence
    round_trips: tuple[tuple[int, float, float], ...] = ()
    longest_draft: int = 0  # the most tokens one verified draft had
    # Token trees: (b, greedy, sampled) for the steps of requests that let a node have up to
    # b > 1 children. Their positions are tree nodes and depths: a step forwards its nodes
    # (drafted_at) and gains its accepted path's depth (accepted_at), so the same MethodModel
    # prices a tree of k nodes as it prices a chain of k tokens.
    trees: tuple[tuple[int, Acceptance, Acceptance], ...] = ()
    # (k, class of sequence counts, calls, seconds total): the same answers kept apart by how
    # many sequences the step asked the method for (`seqs_class`): an in-target head drafts a
    # step's sequences together, so each one's share falls as the batch grows, and a proposer
    # service answers a larger batch more slowly
    round_trips_by_seqs: tuple[tuple[int, int, float, float], ...] = ()

    def acceptance(self, greedy: bool, branches: int = 1) -> Acceptance:
        if branches <= 1:
            return self.greedy if greedy else self.sampled
        for b, g, s in self.trees:
            if b == branches:
                return g if greedy else s
        return Acceptance()

    def round_trip(self, per_sequence: bool = False, seqs: int | None = None) -> RoundTrip:
        """per_sequence: the method drafts inside the verifier (`RoundTrip.per_sequence`).
        With `seqs`, fitted to the steps of that many sequences' class where it has at least
        MIN_CLASS_CALLS answers, else to every answer."""
        if seqs is not None:
            cls = seqs_class(seqs)
            points = [(k, n, s) for k, c, n, s in self.round_trips_by_seqs if c == cls]
            if sum(n for _, n, _ in points) >= MIN_CLASS_CALLS:
                return fit_round_trip(points, per_sequence)
        return fit_round_trip(self.round_trips, per_sequence)

    def draft_limit(self) -> int:
        return draft_limit(self.longest_draft, max((k for k, _, _ in self.round_trips), default=0),
                           self.greedy.drafts + self.sampled.drafts)


def tried_positions(k: int, accepted: int) -> int:
    """Positions of a k-token draft that were tried: the accepted ones, plus the first
    rejected one when not all were accepted."""
    return accepted + (1 if accepted < k else 0)


@dataclass(frozen=True)
class StepCost:
    """The verifier's step time as a function of the batch's tokens: piecewise-linear through
    measured (tokens, seconds) points, non-decreasing; flat below the first point, the last
    segment's slope beyond the last one."""

    tokens: tuple[float, ...]
    seconds: tuple[float, ...]
    tail_slope: float  # seconds per token beyond the last point

    def __call__(self, tokens: float) -> float:
        xs, ys = self.tokens, self.seconds
        if tokens <= xs[0]:
            return ys[0]
        if tokens >= xs[-1]:
            return ys[-1] + self.tail_slope * (tokens - xs[-1])
        i = bisect.bisect_right(xs, tokens)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)


def default_step_cost() -> StepCost:
    return StepCost((1.0,), (DEFAULT_BASE_S + DEFAULT_PER_TOKEN_S,), DEFAULT_PER_TOKEN_S)


def fit_step_cost(buckets: Iterable[tuple[int, float, float]],
                  min_steps: int = MIN_BUCKET_STEPS) -> StepCost:
    """StepCost from (steps, tokens_total, seconds_total) per bucket of batch sizes: one point
    per bucket with enough steps at its mean (tokens, seconds), made non-decreasing (a larger
    batch never costs less) by weighted isotonic regression: neighbours that disagree are
    pooled into their step-weighted mean, so one noisy bucket moves the curve only as much as
    its steps weigh. With one point, the default per-token slope scaled to it."""
    merged: dict[float, list[float]] = {}  # points at the same mean size: one, weighted
    for n, t, s in buckets:
        if n >= min_steps and n > 0:
            acc = merged.setdefault(t / n, [0.0, 0.0])
            acc[0] += s
            acc[1] += n
    points = sorted((x, s / n, n) for x, (s, n) in merged.items())
    if not points:
        return default_step_cost()
    xs = [x for x, _, _ in points]
    ys = _isotonic([(y, float(n)) for _, y, n in points])
    if len(xs) == 1:
        scale = ys[0] / (DEFAULT_BASE_S + DEFAULT_PER_TOKEN_S * xs[0])
        return StepCost(tuple(xs), tuple(ys), DEFAULT_PER_TOKEN_S * scale)
    tail = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
    return StepCost(tuple(xs), tuple(ys), tail)


# What the verifier's step does beside the forward, by which its time is measured apart: a step
# with a token tree (the tree sampler; on an accelerator tree steps also replay other work
# after the graph), else one with a sampled request (the rejection sampler), else all greedy
# (verified inside the forward).
STEP_KINDS = ("greedy", "sampled", "tree")


def step_kind(greedy: bool, branches: int = 1) -> str:
    """The kind of step a request's decoding runs in, alone (its sampling, chains or trees)."""
    return "tree" if branches > 1 else "greedy" if greedy else "sampled"


def seqs_class(n: int) -> int:
    """The class of a step's sequence count its cost is kept apart by: the smallest power of
    two holding it (the step executor's batch buckets; on a CPU each sequence's attention and
    bookkeeping cost a step something whatever its tokens)."""
    return 1 << max(0, (max(n, 1) - 1).bit_length())


@dataclass(frozen=True)
class AnchoredCost:
    """A step cost for one class of sequence counts: its own measured curve over the tokens it
    has seen (`local`), and beyond them the kind's curve over every step (`base`) moved to meet
    it: what more tokens add there, from its level. Below its first point, flat."""

    local: StepCost
    base: "StepCost | AnchoredCost"

    def __call__(self, tokens: float) -> float:
        first, last = self.local.tokens[0], self.local.tokens[-1]
        if tokens <= last:
            return self.local(max(tokens, first))
        return self.local(last) + max(self.base(tokens) - self.base(last), 0.0)


@dataclass(frozen=True)
class StepCosts:
    """The step-cost curve per step kind, each fitted from that kind's own steps; a kind
    without enough of them reads the curve of every step together. Per kind and class of
    sequence counts (`seqs_class`), where that class's steps were measured, its own curve
    anchored on the kind's (`AnchoredCost`): a step's cost depends on how many sequences share
    it, not on its tokens alone."""

    kinds: Mapping[str, StepCost]
    pooled: StepCost
    by_seqs: Mapping[tuple[str, int], AnchoredCost] = field(default_factory=dict)
    # the most tokens a bucket with enough steps had on average (0: no step measured), and
    # whether the replica keeps its steps apart by sequence counts at all (an older verifier
    # does not)
    measured_tokens: float = 0.0
    per_class: bool = False
    # per (method, kind, class of sequence counts): the steps that method ran alone, its own
    # curve anchored on the class's (else the kind's): a method whose process drafts beside
    # the forward costs every step of its own more than its rows do ("off": plain steps)
    by_method: Mapping[tuple[str, str, int], AnchoredCost] = field(default_factory=dict)

    def measured(self, seqs: int) -> bool:
        """Whether a step of `seqs` sequences was measured: its class of sequence counts has
        a curve of its own, or, from a replica that keeps no classes, some bucket of at least
        `seqs` tokens has enough steps. Anything else is the curve extrapolated from smaller
        steps: on a CPU the sequences a batch adds cost a step about what draft rows do, and
        a curve fitted on one sequence's steps prices a large batch's rows as nearly free."""
        if self.per_class:
            return any(c == seqs_class(seqs) for _, c in self.by_seqs)
        return self.measured_tokens >= max(seqs, 1)

    def of(self, kind: str, seqs: int | None = None,
           method: str | None = None) -> "StepCost | AnchoredCost":
        """The curve over batch tokens for a kind of step; with `seqs`, for a step of that
        many sequences where their class was measured; with `method` too, for that method's
        own steps where it ran enough of them alone in that class."""
        if seqs is not None:
            if method:
                found = self.by_method.get((method, kind, seqs_class(seqs)))
                if found is not None:
                    return found
            found = self.by_seqs.get((kind, seqs_class(seqs)))
            if found is not None:
                return found
        return self.kinds.get(kind, self.pooled)


def fit_step_costs(buckets: Iterable[tuple[str, int, float, float]],
                   min_steps: int = MIN_BUCKET_STEPS,
                   by_seqs: Iterable[tuple[str, int, int, float, float]] = (),
                   by_method: Iterable[tuple[str, str, int, int, float, float]] = ()
                   ) -> StepCosts:
    """StepCosts from (kind, steps, tokens_total, seconds_total) per kind and bucket of batch
    tokens (fit_step_cost for each kind, and for all of them pooled by bucket), from
    (kind, seqs class, steps, tokens_total, seconds_total) per kind, class of sequence counts
    and bucket of batch tokens (a class's curve where one of its buckets has enough steps), and
    from (method, kind, seqs class, steps, tokens_total, seconds_total) the same per method
    that ran the steps alone (a method's curve where one of its buckets has enough steps)."""
    by_kind: dict[str, list[tuple[int, float, float]]] = {}
    for kind, n, t, sec in buckets:
        by_kind.setdefault(kind, []).append((n, t, sec))
    kinds = {k: fit_step_cost(b, min_steps) for k, b in by_kind.items()
             if any(n >= min_steps for n, _, _ in b)}
    pooled = fit_step_cost([x for b in by_kind.values() for x in b], min_steps)
    per_class: dict[tuple[str, int], list[tuple[int, float, float]]] = {}
    for kind, cls, n, t, sec in by_seqs:
        if cls > 0:
            per_class.setdefault((kind, cls), []).append((n, t, sec))
    classes = {key: AnchoredCost(fit_step_cost(b, min_steps), kinds.get(key[0], pooled))
               for key, b in per_class.items() if any(n >= min_steps for n, _, _ in b)}
    per_method: dict[tuple[str, str, int], list[tuple[int, float, float]]] = {}
    for method, kind, cls, n, t, sec in by_method:
        if cls > 0 and method:
            per_method.setdefault((method, kind, cls), []).append((n, t, sec))
    methods = {key: AnchoredCost(fit_step_cost(b, min_steps),
                                 classes.get(key[1:], kinds.get(key[1], pooled)))
               for key, b in per_method.items() if any(n >= min_steps for n, _, _ in b)}
    measured = max((t / n for b in by_kind.values() for n, t, _ in b if n >= min_steps and n > 0),
                   default=0.0)
    return StepCosts(kinds, pooled, classes, measured, bool(per_class), methods)


def _isotonic(values: list[tuple[float, float]]) -> list[float]:
    """Non-decreasing fit of (value, weight) pairs: pool adjacent violators."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for y, w in values:
        blocks.append([y, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            y2, w2, c2 = blocks.pop()
            y1, w1, c1 = blocks.pop()
            blocks.append([(y1 * w1 + y2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return [y for y, _, c in blocks for _ in range(int(c))]


def batch_goodput(model: MethodModel | None, k: int, batch: int, cost: StepCost,
                  seconds: list[float] | None = None) -> float:
    """Tokens per second of a batch of `batch` sequences that all ask for k-token drafts
    (k = 0 or no model: plain decoding, no proposer to wait for). One sequence's step is
    priced over the rows its draft really has (`step_seconds`, given up to k or beyond when
    weighing every k); a batch's at its mean rows, which its sequences' drafts average out."""
    batch = max(batch, 1)
    if k <= 0 or model is None:
        return batch / cost(batch)
    if batch > 1:
        step = cost(batch * model.tokens(k))
    else:
        step = (seconds or model.step_seconds(k, cost))[k]
    wait = model.round_trip(k) * (batch if model.round_trip.per_sequence else 1)
    return batch * model.expected(k) / (step + wait)


def marginal_goodput(model: MethodModel, k: int, cost: StepCost, others_tokens: float,
                     others_expected: float, wait_s: float,
                     seconds: list[float] | None = None, standing_s: float = 0.0) -> float:
    """Tokens per second of one step when one sequence asks for k draft tokens and the rest of
    the batch forwards `others_tokens` and emits `others_expected` tokens. `wait_s` is what its
    draft adds to the step's wait (0 when its proposer is asked anyway). `seconds`: the
    model's step_seconds for these others up to k or beyond (when weighing every k).
    `standing_s`: what its method costs the step whatever k, pausing included (an in-target
    head's learning from the step); part of `wait_s` when that is measured with it."""
    if k <= 0:
        return (others_expected + 1.0) / (cost(others_tokens + 1.0) + standing_s)
    if seconds is None:
        seconds = model.step_seconds(k, cost, others_tokens)
    return (others_expected + model.expected(k)) / (seconds[k] + max(wait_s, standing_s))


@dataclass(frozen=True)
class Choice:
    method: Hashable | None  # the chosen key of `choose`'s models (a method, or the gateway's
    # (method, branches)); None: off
    k: int
    goodput: float  # tokens/s the model expects
    reason: str  # goodput | low_acceptance | compute_bound


def best_k(model: MethodModel, batch: int, cost: StepCost, k_max: int,
           k_min: int = 1) -> tuple[int, float]:
    """The k in [k_min, k_max] (k_min >= 1) with the highest batch goodput, and that goodput;
    ties go to the smaller k."""
    seconds = model.step_seconds(k_max, cost) if batch <= 1 else None  # every k at once
    best = (k_min, batch_goodput(model, k_min, batch, cost, seconds))
    for k in range(k_min + 1, k_max + 1):
        g = batch_goodput(model, k, batch, cost, seconds)
        if g > best[1] * (1 + 1e-9):
            best = (k, g)
    return best


def choose(models: Mapping[Hashable, MethodModel], batch: int, cost: StepCost, k_max: int,
           allow_off: bool = True, margin: float = SPECULATION_MARGIN,
           costs: Mapping[Hashable, StepCost] | None = None,
           k_floor: Mapping[Hashable, int] | None = None) -> Choice:
    """The (method, k) with the highest goodput for a batch of `batch` sequences, or off when
    no method beats plain decoding by `margin` (never off when allow_off is False). `cost` is
    plain decoding's step cost and every method's unless `costs` gives the method its own (a
    kind of step that costs more: trees, StepCosts). `k_floor` gives a method the smallest k
    it runs as measured (lookahead: its window's nodes; below them it drafts without the
    window, a different method than the one its acceptance was measured on).

    Why off: `low_acceptance` when the best method would not pay even in a batch of one (the
    cheapest case for speculation), else `compute_bound` (the batch makes drafts too dear)."""
    off = batch_goodput(None, 0, batch, cost)
    costs, k_floor = costs or {}, k_floor or {}
    best: Choice | None = None
    for method in sorted(models):
        k, g = best_k(models[method], batch, costs.get(method, cost), k_max,
                      min(max(k_floor.get(method, 1), 1), k_max))
        if best is None or g > best.goodput * (1 + 1e-9):
            best = Choice(method, k, g, "goodput")
    if best is None:
        return Choice(None, 0, off, "no_proposer")
    if not allow_off or best.goodput > off * (1 + margin):
        return best
    _, alone = best_k(models[best.method], 1, costs.get(best.method, cost), k_max,
                      min(max(k_floor.get(best.method, 1), 1), k_max))
    pays_alone = alone > batch_goodput(None, 0, 1, cost) * (1 + margin)
    return Choice(None, 0, off, "compute_bound" if pays_alone else "low_acceptance")


def decay_factor(new_tried: float, half_life: float) -> float:
    """Weight left on old counts after `new_tried` more positions, halving every half_life."""
    if half_life <= 0 or not math.isfinite(half_life):
        return 1.0
    return 0.5 ** (max(new_tried, 0.0) / half_life)


# -- the request itself: how long its prompt is --------------------------------------------------
# A request whose prompt is at least this many tokens is of the "long" class: summaries,
# retrieval-augmented answers, questions about a given document. Their answers quote the prompt,
# so retrieval drafts (prompt lookup, suffix decoding, hybrids with them) accept far more there
# than on open chat (Spec-Bench's prompt lookup: 2.5x on summarization, 1.2x on MT-bench), and
# one acceptance per method averaged over both classes misprices both.
LONG_PROMPT_TOKENS = 384
CHARS_PER_TOKEN = 4  # a text prompt's length in tokens, before the verifier tokenizes it
PROMPT_CLASSES = ("short", "long")


def prompt_class(prompt_tokens: int) -> str:
    """The class of a request by its prompt's length in tokens (an estimate for text)."""
    return "long" if prompt_tokens >= LONG_PROMPT_TOKENS else "short"


def request_acceptance(accepted: int, proposed: int, steps: int,
                       rejections: int | None = None) -> Acceptance:
    """One finished request's acceptance from its usage (accepted and proposed draft tokens,
    steps, and the drafts with a rejected token when its verifier reports them): each drafting
    step that was not accepted in full tried one position beyond its accepted ones. Without
    that count (0 from an older verifier while some draft token was rejected), at most `steps`
    of those and at most proposed - accepted: a bound that counts every step, drafting or not,
    so it prices a method that drafts on a third of its steps (prompt lookup, suffix decoding)
    as rejected on all of them. (On Spec-Bench's QA a suffix request of 82 draft tokens, 9
    accepted, in 55 steps of which 24 drafted read 9 / 64 = 0.14 where its drafts give at
    least 9 / 33 = 0.27; with every method's short-prompt acceptance read so, auto ran such
    requests plainly, `low_acceptance`.)"""
    if rejections is None or (rejections <= 0 and accepted < proposed):
        rejections = min(steps, proposed - accepted)
    return Acceptance.from_counts(accepted, max(0, min(rejections, proposed - accepted)))


def class_model(model: MethodModel, measured: Acceptance, min_tried: float,
                quoting: bool = False) -> MethodModel:
    """A method's model for a class of requests: its positions moved to the acceptance that
    class measured (MethodModel.for_request), once the class has `min_tried` positions; else
    the method's model as it is, except for `quoting` (retrieval drafts for a long prompt the
    answer will quote): there at least the prior acceptance, PRIOR_ACCEPTANCE, until the class
    has its own data. The method's own estimate is mostly short prompts' (open chat, where
    copying rarely pays) and would keep a summary off retrieval drafts that its class never
    tried."""
    if measured.tried < min_tried:
        if quoting and model.acceptance < PRIOR_ACCEPTANCE:
            return model.for_request(PRIOR_ACCEPTANCE, model.hit_rate)
        return model
    return model.for_request(measured.rate(), model.hit_rate)
