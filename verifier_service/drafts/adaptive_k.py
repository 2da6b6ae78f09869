"""Per-step k for requests the gateway's policy marked adaptive (SpeculationPlan.adaptive).

Before every step, each such sequence gets the k in [k_min, k_max] that maximises the step's
goodput (splitspec/goodput.py `marginal_goodput`), given:
  * its acceptance and hit rate (steps that got a draft): its own drafts so far, shrunk
    towards its method's on this verifier for the same kind of request (greedy or sampled);
  * the step's cost: the verifier's measured step time by batch tokens for a step of as many
    sequences as are running, of its method's own steps where it ran enough of them alone
    (EngineStats.step_cost, step_cost_by_seqs, step_cost_by_method), with the rest of the
    running batch as it was in its last step (each decoding sequence forwards 1 + its last k
    tokens and emits 1 + its last accepted; a prefilling one forwards its uncached tokens);
  * the proposer's round trip for k tokens (fitted per k, from steps of as many sequences as
    are running where those were measured), counted only when no other sequence of the batch
    asks the same proposer (the engine waits for every proposer once per step).
k_min is 0 for mode auto (speculation may pause while the batch is compute-bound and resume
when it is not) and 1 for mode on without an explicit k. The gateway already required drafting
to beat plain decoding by a margin, so here the best k simply wins (ties: the smaller), but a
pause only where it is expected to pay by PAUSE_MARGIN (the rows it saves are priced at the
curve's mean slope; on a CPU rows inside a tile cost nothing). A paused
request learns nothing new about its acceptance, so after PROBE_AFTER paused steps in a row its
next step drafts (its best k >= 1) once: a request whose first drafts were unlucky recovers.
"""

from __future__ import annotations

from dataclasses import dataclass

from splitspec.goodput import (
    Acceptance,
    MethodModel,
    StepCost,
    StepCosts,
    fit_step_costs,
    marginal_goodput,
    seqs_class,
)
from splitspec.methods import components_of, in_target_methods, step_kind_of
from verifier_service.batching.sequence import SequenceState
from verifier_service.telemetry.stats import EngineStats

# A request's own history is weighed against its method's acceptance as if that were this many
# tried draft positions of its own.
REQUEST_PRIOR_STRENGTH = 8.0
# A paused request drafts once after this many paused steps in a row.
PROBE_AFTER = 8
# A request pauses (k = 0) only when that is expected to beat its best k >= 1 by this share.
PAUSE_MARGIN = 0.05
# The step-cost curve and the method models are refitted from the counters every this share of
# the steps so far (at least every step, at most every REFIT_MAX_STEPS): refitting them every
# step took half of choosing k (0.43 -> 0.21 ms per sequence and step on a CPU), and one step
# adds 1/n of what they know.
REFIT_SHARE = 1 / 16
REFIT_MAX_STEPS = 32


@dataclass
class _Batch:
    """The running batch as its last step left it."""

    tokens: float = 0.0
    expected: float = 0.0
    drafting: dict[str, int] | None = None  # method -> sequences that drafted last step
    candidates: dict[str, int] | None = None  # method -> running sequences planned with it


def _last_share(seq: SequenceState) -> tuple[float, float, str | None]:
    """(tokens forwarded, tokens emitted, method if it drafted) of seq's last step."""
    uncached = len(seq.tokens) - seq.num_computed
    if uncached > 1 or not seq.timeline.steps:
        return float(max(uncached, 1)), 1.0, None
    last = seq.timeline.steps[-1]
    method = seq.inp.speculation.method if last.k > 0 else None
    return 1.0 + last.k, 1.0 + last.accepted, method


class AdaptiveK:
    def __init__(self, stats: EngineStats, k_max: int, probe_after: int = PROBE_AFTER):
        self.stats = stats
        self.k_max = k_max
        self.probe_after = probe_after
        self._cost: StepCosts | None = None
        self._fitted_at = -1  # stats.steps when the curve and the models were fitted
        self._batch: _Batch | None = None
        self._methods: dict[tuple[str, bool, int], MethodModel] = {}

    def begin_step(self) -> None:
        """Forget the cached view of the batch (the running set may change before this step),
        and the fitted curve and method models when enough steps were added since
        (REFIT_SHARE)."""
        self._batch = None
        steps, last = self.stats.steps, self._fitted_at
        if last < 0 or steps - last >= max(1, min(REFIT_MAX_STEPS, int(last * REFIT_SHARE))):
            self._cost = None
            self._methods.clear()
            self._fitted_at = steps

    def step_cost(self, kind: str = "greedy", seqs: int | None = None,
                  method: str | None = None) -> StepCost:
        """The step-cost curve of a kind of step (splitspec.goodput.step_kind); with `seqs`,
        of a step of that many sequences, and with `method`, of that method's own steps where
        it ran enough of them alone (StepCosts.of)."""
        if self._cost is None:
            self._cost = fit_step_costs(
                ((b.kind, b.steps, b.tokens_total, b.seconds_total) for b in self.stats.step_cost),
                by_seqs=((b.kind, b.max_seqs, b.steps, b.tokens_total, b.seconds_total)
                         for b in self.stats.step_cost_by_seqs.values()),
                by_method=((b.method, b.kind, b.max_seqs, b.steps, b.tokens_total,
                            b.seconds_total) for b in self.stats.step_cost_by_method.values()))
        return self._cost.of(kind, seqs, method)

    def acceptance(self, seq: SequenceState) -> float:
        return self.model(seq).acceptance

    def model(self, seq: SequenceState, seqs: int | None = None) -> MethodModel:
        """The request's own acceptance and hit rate, shrunk towards its method's (whose round
        trip is, with `seqs`, that of a step of that many sequences)."""
        plan = seq.inp.speculation
        prior = self.method_model(plan.method or "", seq.inp.sampling.greedy, plan.num_branches,
                                  seqs)
        own = Acceptance.from_counts(seq.accepted, seq.rejections, seq.drafts, seq.asked)
        # the method's measured positions, scaled to the request's own (shrunk) rates
        return prior.for_request(own.rate(prior.acceptance, REQUEST_PRIOR_STRENGTH),
                                 own.hit_rate(prior.hit_rate, REQUEST_PRIOR_STRENGTH))

    def method_model(self, name: str, greedy: bool, branches: int = 1,
                     seqs: int | None = None) -> MethodModel:
        """The method's model for one kind of request (greedy or sampled; chains, or trees of
        up to `branches` children per node), from its counters (once per step); with `seqs`,
        its round trip in a step of that many sequences."""
        key = (name, greedy, branches, seqs_class(seqs) if seqs is not None else 0)
        if key not in self._methods:
            counts = self.stats.method(name).counts()
            self._methods[key] = MethodModel.from_acceptance(
                counts.acceptance(greedy, branches),
                counts.round_trip(any(m in in_target_methods() for m in components_of(name)),
                                  seqs), counts.draft_limit())
        return self._methods[key]

    def _view(self, running: list[SequenceState]) -> _Batch:
        if self._batch is None:
            batch = _Batch(drafting={}, candidates={})
            for s in running:
                tokens, emitted, method = _last_share(s)
                batch.tokens += tokens
                batch.expected += emitted
                if method is not None:
                    batch.drafting[method] = batch.drafting.get(method, 0) + 1
                plan = s.inp.speculation
                if plan.enabled:
                    batch.candidates[plan.method] = batch.candidates.get(plan.method, 0) + 1
            self._batch = batch
        return self._batch

    def choose(self, seq: SequenceState, running: list[SequenceState]) -> int:
        """The k for seq's next step, in [plan.k_min, k_max]."""
        plan = seq.inp.speculation
        batch = self._view(running)
        tokens, emitted, drafted = _last_share(seq)
        others_tokens = max(batch.tokens - tokens, 0.0)
        others_expected = max(batch.expected - emitted, 0.0)
        others_drafting = batch.drafting.get(plan.method, 0) - (drafted == plan.method)
        sharing = max(batch.candidates.get(plan.method, 0), 1)
        model = self.model(seq, len(running))
        # its method's own steps where measured: what the method costs a step beside its
        # rows (its proposer drafting beside the forward) is paid whatever k, pausing too
        cost = self.step_cost(step_kind_of(plan.method, seq.inp.sampling.greedy,
                                           plan.num_branches), len(running), plan.method)
        probe = self.probe_after > 0 and seq.paused_steps >= self.probe_after
        # what the method costs this sequence's step even when it pauses (an EAGLE head's
        # advance over the verified rows): pausing does not save it
        standing = self.stats.method(plan.method or "").standing_seconds()
        best_k, best = 0, -1.0
        paused = -1.0  # the goodput of pausing (k = 0), when allowed
        seconds = model.step_seconds(self.k_max, cost, others_tokens)  # every k at once
        for k in range(max(plan.k_min, 1 if probe else 0), self.k_max + 1):
            # Its proposer is waited for anyway when others ask it (their k: about as large).
            # When none did last step, the wait is shared by every sequence planned with the
            # method: each alone would find the whole round trip too dear, and all of them
            # would stay paused where drafting together pays.
            # An in-target method drafts each sequence apart: its time is this one's own.
            if model.round_trip.per_sequence:
                wait = model.round_trip(k)
            else:
                wait = 0.0 if others_drafting > 0 else model.round_trip(k) / sharing
            g = marginal_goodput(model, k, cost, others_tokens, others_expected, wait, seconds,
                                 standing)
            if k == 0:
                paused = g
            elif g > best * (1 + 1e-9):
                best_k, best = k, g
        # pausing only where the model expects it to pay by PAUSE_MARGIN: the rows a pause saves
        # are priced at the curve's mean slope, and on a CPU they cost nothing inside a tile
        if paused >= 0 and (best < 0 or paused > best * (1 + PAUSE_MARGIN)):
            best_k = 0
        seq.paused_steps = 0 if best_k else seq.paused_steps + 1
        return best_k
