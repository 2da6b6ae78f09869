"""What the gateway's speculation policy knows about the verifiers, built from their stats.

Each replica's Verifier/WatchStats snapshot (gateway/stats_watch.py converts it to a
`ReplicaSnapshot`) is compared with the previous one of the same replica, and the differences
feed the estimates the policy reads:
  * acceptance per (method, greedy or sampled), pooled over replicas: accepted and tried draft
    positions, with older counts halving every HALF_LIFE_TRIED newly tried positions of the same
    kind of request, so that the estimate follows the traffic and a method that is not chosen
    any more loses weight (the policy explores it again once it is stale);
  * each replica's step time by batch tokens (per kind of step, class of sequence counts and
    the method that ran the step alone) and each proposer's round trip by k (counters
    since the replica's start, fitted on demand), its load (running + waiting), its running
    count averaged over recent snapshots (weight RUNNING_ALPHA for the newest), and its batch
    limit.
A replica whose counters went backwards restarted: its snapshot counts from zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from splitspec.goodput import (
    Acceptance,
    MethodCounts,
    ReplicaLoad,
    RoundTrip,
    StepCost,
    StepCosts,
    decay_factor,
    fit_step_costs,
    request_acceptance,
    seqs_class,
)
from splitspec.methods import components_of, in_target_methods

HALF_LIFE_TRIED = 2000.0
RUNNING_ALPHA = 0.2  # at the default 500 ms between snapshots: about 2.5 s of memory


@dataclass(frozen=True)
class MethodSnapshot(MethodCounts):
    """A method's counters since the replica started, and whether it is available there."""

    unavailable: str = ""


@dataclass
class ReplicaSnapshot(ReplicaLoad):
    """One replica's WatchStats snapshot: its load, and its counters since it started."""

    steps: int = 0
    methods: dict[str, MethodSnapshot] = field(default_factory=dict)
    # (kind, steps, tokens, seconds) per kind of step and bucket of batch tokens
    step_cost: tuple[tuple[str, int, float, float], ...] = ()
    # (kind, class of sequence counts, steps, tokens, seconds): the same steps kept apart by
    # how many sequences they ran (goodput.seqs_class)
    step_cost_by_seqs: tuple[tuple[str, int, int, float, float], ...] = ()
    # (method, kind, class, steps, tokens, seconds): of those, the steps one method ran alone
    # ("off": plain decoding's)
    step_cost_by_method: tuple[tuple[str, str, int, int, float, float], ...] = ()


@dataclass
class Estimates:
    half_life_tried: float = HALF_LIFE_TRIED
    running_alpha: float = RUNNING_ALPHA
    # (method, greedy, branches): chains are branches 1, token trees of up to b children b
    acceptance: dict[tuple[str, bool, int], Acceptance] = field(default_factory=dict)
    replicas: dict[str, ReplicaSnapshot] = field(default_factory=dict)
    recent_running: dict[str, float] = field(default_factory=dict)
    # this gateway's generations streaming from the replica when its snapshot arrived: the
    # snapshot's running + waiting count includes them
    local_at_snapshot: dict[str, int] = field(default_factory=dict)
    # (prompt class, method, greedy, branches): acceptance of the gateway's own finished
    # requests of that class (goodput.prompt_class), decayed as `acceptance` is
    by_class: dict[tuple[str, str, bool, int], Acceptance] = field(default_factory=dict)
    _costs: dict[str, StepCosts] = field(default_factory=dict)
    _round_trips: dict[tuple[str, str, int], RoundTrip] = field(default_factory=dict)

    def observe(self, address: str, snap: ReplicaSnapshot, local_in_flight: int = 0) -> None:
        prev = self.replicas.get(address)
        if prev is None or snap.steps < prev.steps:
            prev = ReplicaSnapshot()  # first sight, or the replica restarted
        for greedy in (True, False):
            deltas = {}
            for name, m in snap.methods.items():
                old = prev.methods.get(name, MethodSnapshot())
                for b in {1, *(t[0] for t in m.trees)}:
                    deltas[(name, b)] = m.acceptance(greedy, b).minus(old.acceptance(greedy, b))
            self.add_acceptance(greedy, deltas)
        self.replicas[address] = snap
        self.local_at_snapshot[address] = local_in_flight
        old_running = self.recent_running.get(address, float(snap.running))
        self.recent_running[address] = ((1 - self.running_alpha) * old_running
                                        + self.running_alpha * snap.running)
        self._costs.pop(address, None)
        for key in [k for k in self._round_trips if k[0] == address]:
            del self._round_trips[key]

    def add_acceptance(self, greedy: bool, deltas: dict[tuple[str, int], Acceptance]) -> None:
        """New counts for one kind of request, per (method, branches): 1 for chains."""
        new = sum(d.tried for d in deltas.values())
        if new <= 0 and not any(d.asked for d in deltas.values()):
            return
        factor = decay_factor(new, self.half_life_tried)
        for key in [k for k in self.acceptance if k[1] == greedy]:
            self.acceptance[key] = self.acceptance[key].scaled(factor)
        for (name, branches), d in deltas.items():
            key = (name, greedy, branches)
            self.acceptance[key] = self.acceptance.get(key, Acceptance()).plus(d)

    def acceptance_of(self, method: str, greedy: bool, branches: int = 1) -> Acceptance:
        return self.acceptance.get((method, greedy, branches), Acceptance())

    def observe_request(self, cls: str, method: str, greedy: bool, branches: int,
                        accepted: int, proposed: int, steps: int,
                        rejections: int | None = None, overall: bool = False) -> None:
        """A finished request of prompt class `cls` that speculated with `method`: its usage's
        counts join that class's acceptance (older counts of the class and kind decay). With
        `overall`, they join the method's acceptance over all requests too: for a candidate
        the verifier's counts do not tell apart (a shaped ngram, gateway/policy.py), which
        decays there with the counts the verifier reports."""
        d = request_acceptance(accepted, proposed, steps, rejections)
        if d.tried <= 0:
            return
        factor = decay_factor(d.tried, self.half_life_tried)
        for key in [k for k in self.by_class if k[0] == cls and k[2] == greedy]:
            self.by_class[key] = self.by_class[key].scaled(factor)
        key = (cls, method, greedy, max(branches, 1))
        self.by_class[key] = self.by_class.get(key, Acceptance()).plus(d)
        if overall:
            key = (method, greedy, max(branches, 1))
            self.acceptance[key] = self.acceptance.get(key, Acceptance()).plus(d)

    def class_acceptance(self, cls: str, method: str, greedy: bool,
                         branches: int = 1) -> Acceptance:
        return self.by_class.get((cls, method, greedy, branches), Acceptance())

    def round_trip(self, address: str, method: str, seqs: int | None = None) -> RoundTrip:
        """The method's answer time on the replica; with `seqs`, for a step of that many
        sequences (MethodCounts.round_trip)."""
        key = (address, method, seqs_class(seqs) if seqs is not None else 0)
        if key not in self._round_trips:
            snap = self.replicas.get(address)
            m = snap.methods.get(method) if snap else None
            # drafts per sequence, in the verifier (a hybrid with an in-target component too)
            in_target = any(m in in_target_methods() for m in components_of(method))
            self._round_trips[key] = (m.round_trip(in_target, seqs) if m
                                      else RoundTrip(per_sequence=in_target))
        return self._round_trips[key]

    def draft_limit(self, address: str, method: str) -> int:
        snap = self.replicas.get(address)
        m = snap.methods.get(method) if snap else None
        return m.draft_limit() if m else 0

    def load(self, address: str) -> int:
        snap = self.replicas.get(address)
        return snap.running + snap.waiting if snap else 0

    def others_load(self, address: str) -> int:
        """Running + waiting on the replica that did not come from this gateway (as of its
        last snapshot): other gateways' requests, or requests sent to it directly."""
        return max(self.load(address) - self.local_at_snapshot.get(address, 0), 0)

    def cost(self, address: str, kind: str = "greedy", seqs: int | None = None,
             method: str | None = None) -> StepCost:
        """The replica's step-cost curve for a kind of step (splitspec.goodput.step_kind); with
        `seqs`, for a step of that many sequences, and with `method`, of that method's own
        steps where it has measured them ("off": plain decoding's; StepCosts.of)."""
        return self._step_costs(address).of(kind, seqs, method)

    def cost_measured(self, address: str, seqs: int) -> bool:
        """Whether the replica has measured steps of `seqs` sequences (StepCosts.measured);
        False for a replica the gateway has no stats of."""
        return address in self.replicas and self._step_costs(address).measured(seqs)

    def _step_costs(self, address: str) -> StepCosts:
        if address not in self._costs:
            snap = self.replicas.get(address)
            self._costs[address] = fit_step_costs(
                snap.step_cost if snap else (),
                by_seqs=snap.step_cost_by_seqs if snap else (),
                by_method=snap.step_cost_by_method if snap else ())
        return self._costs[address]
