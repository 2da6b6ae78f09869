"""What the gateway's speculation policy knows about the verifiers, built from their stats.

Each replica's Verifier/WatchStats snapshot (gateway/stats_watch.py converts it to a
`ReplicaSnapshot`) is compared with the previous one of the same replica, and the differences
feed the estimates the policy reads:
  * acceptance per (method, greedy or sampled), pooled over replicas: accepted and tried draft
    positions, with older counts halving every HALF_LIFE_TRIED newly tried positions of the same
    kind of request, so that the estimate follows the traffic and a method that is not chosen
    any more loses weight (the policy explores it again once it is stale);
  * each proposer's round trip: an exponential moving average of the mean per interval;
  * each replica's step time by batch tokens (counters since its start, fitted on demand) and
    its load (running + waiting) and batch limit.
A replica whose counters went backwards restarted: its snapshot counts from zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from splitspec.goodput import Acceptance, StepCost, decay_factor, default_step_cost, fit_step_cost

HALF_LIFE_TRIED = 2000.0
ROUND_TRIP_ALPHA = 0.3  # weight of the newest interval in the round-trip average


@dataclass(frozen=True)
class MethodSnapshot:
    greedy: Acceptance = Acceptance()  # counters since the replica started
    sampled: Acceptance = Acceptance()
    round_trip_seconds: float = 0.0
    round_trips: int = 0
    unavailable: str = ""


@dataclass(frozen=True)
class ReplicaSnapshot:
    running: int = 0
    waiting: int = 0
    max_num_seqs: int = 0
    steps: int = 0
    methods: dict[str, MethodSnapshot] = field(default_factory=dict)
    step_cost: tuple[tuple[int, float, float], ...] = ()  # (steps, tokens, seconds) per bucket


@dataclass
class Estimates:
    half_life_tried: float = HALF_LIFE_TRIED
    round_trip_alpha: float = ROUND_TRIP_ALPHA
    acceptance: dict[tuple[str, bool], Acceptance] = field(default_factory=dict)  # (m, greedy)
    round_trip_s: dict[str, float] = field(default_factory=dict)
    replicas: dict[str, ReplicaSnapshot] = field(default_factory=dict)
    _costs: dict[str, StepCost] = field(default_factory=dict)

    def observe(self, address: str, snap: ReplicaSnapshot) -> None:
        prev = self.replicas.get(address)
        if prev is None or snap.steps < prev.steps:
            prev = ReplicaSnapshot()  # first sight, or the replica restarted
        for greedy in (True, False):
            deltas = {}
            for name, m in snap.methods.items():
                old = prev.methods.get(name, MethodSnapshot())
                now, before = (m.greedy, old.greedy) if greedy else (m.sampled, old.sampled)
                deltas[name] = (max(now.accepted - before.accepted, 0.0),
                                max(now.tried - before.tried, 0.0))
            self.add_acceptance(greedy, deltas)
        for name, m in snap.methods.items():
            old = prev.methods.get(name, MethodSnapshot())
            n = m.round_trips - old.round_trips
            if n > 0:
                self.add_round_trip(name, (m.round_trip_seconds - old.round_trip_seconds) / n)
        self.replicas[address] = snap
        self._costs.pop(address, None)

    def add_acceptance(self, greedy: bool, deltas: dict[str, tuple[float, float]]) -> None:
        """New (accepted, tried) positions per method for one kind of request."""
        new = sum(t for _, t in deltas.values())
        if new <= 0:
            return
        factor = decay_factor(new, self.half_life_tried)
        for key in [k for k in self.acceptance if k[1] == greedy]:
            self.acceptance[key] = self.acceptance[key].scaled(factor)
        for name, (acc, tried) in deltas.items():
            key = (name, greedy)
            self.acceptance[key] = self.acceptance.get(key, Acceptance()).plus(acc, tried)

    def add_round_trip(self, method: str, seconds: float) -> None:
        old = self.round_trip_s.get(method)
        a = self.round_trip_alpha
        self.round_trip_s[method] = seconds if old is None else (1 - a) * old + a * seconds

    def acceptance_of(self, method: str, greedy: bool) -> Acceptance:
        return self.acceptance.get((method, greedy), Acceptance())

    def load(self, address: str) -> int:
        snap = self.replicas.get(address)
        return snap.running + snap.waiting if snap else 0

    def cost(self, address: str) -> StepCost:
        if address not in self._costs:
            snap = self.replicas.get(address)
            self._costs[address] = (fit_step_cost(snap.step_cost) if snap
                                    else default_step_cost())
        return self._costs[address]
