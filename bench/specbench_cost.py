"""Where a Spec-Bench configuration's time per step goes (bench/specbench.py): read from what the
stack already measures, around the configuration's timed pass (requests one at a time, so the
differences are that pass's own), no timer added to the step.

    the verifier's /metrics      splitspec_engine_step_seconds (count, sum): its engine steps
                                 and their time; splitspec_spec_decode_proposer_round_trip_
                                 seconds_sum{method}: the step's wait for each registered
                                 method's drafts (a proposer's round trip; an in-target head's
                                 drafting and its learning from the last step, inside the step)
    the verifier's WatchStats    step_cost buckets: decoding steps' time without that wait and
                                 without the heads' learning (the target's forward, the
                                 sampler, the step's bookkeeping), by kind of step (chains
                                 verified inside the forward: "greedy"; token trees: "tree")
                                 and batch rows
    the client                   wall time and tokens of every answer (prefill included)

Per step (client wall time over engine steps, every part over the same steps, so they add up):

    drafting  = round-trip seconds of the registered methods / steps  (a hybrid's components
                each once: the hybrid's own label, their sum, is not added again)
    verify    = decoding steps' step-cost seconds / steps             (forward, sampling,
                bookkeeping of the steps that emitted tokens)
    prefill   = (engine step seconds - drafting - verify) / steps     (the prompts' steps, and
                what an in-target method learnt outside its drafting)
    rest      = (client wall seconds - engine step seconds) / steps   (gateway, gRPC, streaming,
                the engine's idle time between steps)

and per kind of decoding step: its share of steps, mean rows fed and mean verify milliseconds,
so a tree step's price against a chain step's of the same configuration is a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STEP = "splitspec_engine_step_seconds"
ROUND_TRIP = "splitspec_spec_decode_proposer_round_trip_seconds_sum"


@dataclass
class CostSample:
    """One reading of a stack's counters: /metrics samples {(name, labels): value} and
    WatchStats' step cost {kind: [steps, rows, seconds]}."""

    metrics: dict = field(default_factory=dict)
    step_cost: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class StepSplit:
    """A pass's time per step, split (see the module docstring); seconds are totals."""

    steps: int
    wall_s: float
    step_s: float
    draft_s: float
    tokens: int
    kinds: dict[str, tuple[int, float, float]]  # decoding steps: kind -> (steps, rows, seconds)

    def ms(self, seconds: float) -> float:
        return 1e3 * seconds / self.steps if self.steps else 0.0

    @property
    def per_step_ms(self) -> float:
        return self.ms(self.wall_s)

    @property
    def draft_ms(self) -> float:
        return self.ms(self.draft_s)

    @property
    def verify_s(self) -> float:
        """The decoding steps' time without drafting (every kind of step)."""
        return sum(seconds for _, _, seconds in self.kinds.values())

    @property
    def verify_ms(self) -> float:
        return self.ms(self.verify_s)

    @property
    def prefill_ms(self) -> float:
        return self.ms(self.step_s - self.draft_s - self.verify_s)

    @property
    def rest_ms(self) -> float:
        return self.ms(self.wall_s - self.step_s)

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    def kind(self, name: str) -> tuple[float, float, float] | None:
        """(share of decoding steps, mean rows, mean verify ms) of one kind, None if none."""
        steps, rows, seconds = self.kinds.get(name, (0, 0.0, 0.0))
        total = sum(s for s, _, _ in self.kinds.values())
        if not steps:
            return None
        return steps / total, rows / steps, 1e3 * seconds / steps


def _get(sample: CostSample, name: str, **labels) -> float:
    return sample.metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def split(before: CostSample, after: CostSample, wall_s: float, tokens: int,
          methods: tuple[str, ...]) -> StepSplit:
    """The pass between two readings: `wall_s` and `tokens` the client's (every answer's),
    `methods` the registered methods whose drafting to count (hybrids' labels never)."""
    def delta(name: str, **labels) -> float:
        return _get(after, name, **labels) - _get(before, name, **labels)

    kinds = {}
    for kind, (steps, rows, seconds) in after.step_cost.items():
        b = before.step_cost.get(kind, [0, 0.0, 0.0])
        if steps - b[0] > 0:
            kinds[kind] = (int(steps - b[0]), rows - b[1], seconds - b[2])
    return StepSplit(steps=int(delta(f"{STEP}_count")), wall_s=wall_s,
                     step_s=delta(f"{STEP}_sum"),
                     draft_s=sum(delta(ROUND_TRIP, method=m) for m in methods),
                     tokens=tokens, kinds=kinds)


def read(stack) -> CostSample:
    """The stack's verifier counters now (its /metrics and one WatchStats message)."""
    import grpc
    from stack_probe import StackProbe

    from protos import verifier_pb2, verifier_pb2_grpc

    probe = StackProbe(stack)
    try:
        metrics = probe.scrape("verifier")
    finally:
        probe.client.close()
    cost: dict[str, list[float]] = {}
    with grpc.insecure_channel(f"127.0.0.1:{stack.verifier.port}") as ch:
        stream = verifier_pb2_grpc.VerifierStub(ch).WatchStats(
            verifier_pb2.WatchStatsRequest(interval_ms=1000), timeout=10)
        try:
            stats = next(iter(stream))
        finally:
            stream.cancel()
    for b in stats.step_cost:
        entry = cost.setdefault(b.kind or "greedy", [0, 0.0, 0.0])
        entry[0] += b.steps
        entry[1] += b.tokens_total
        entry[2] += b.seconds_total
    return CostSample(metrics, cost)
