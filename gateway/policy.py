"""The per-request speculation decision (docs/policy.md).

`auto` (the default mode) picks the (method, k), k = 0 meaning off, with the highest expected
goodput (splitspec/goodput.py) for the batch the request is about to join: acceptance per method
measured online and kept apart for greedy and sampled requests, the verifier's measured step
time by batch tokens (each method's own steps where it ran enough of them alone: a method whose
proposers draft beside the forward costs its steps more than its rows do; plain decoding's own
for off) and each proposer's round trip (gateway/estimates.py, fed by
gateway/stats_watch.py). The verifier then re-decides k every step from the request's own
acceptance and the actual batch (SpeculationPlan.adaptive; verifier_service/drafts/adaptive_k.py).
The decision is a `splitspec.params.SpeculationPlan`, the one type the verifier's engine runs;
the front door sends it as GenerateRequest.speculation_plan (splitspec/wire.py `plan_to_pb`).

Rules, in order:
  mode off, or k = 0                off                          requested_off / requested_k0
  mode on, k given                  exactly that (method: the request's, else the first served)
                                                                 requested_on
  mode on without k                 that method, the policy's k (>= 1), adapted per step
                                                                 requested_on
  auto, no proposer served          off                          no_proposer
  auto, load >= --speculative-disable-queue-size
                                    off                          queue_size
  auto, the replica has not measured a step of the batch's size (its class of sequence counts)
                                    off                          unmeasured_batch
  auto, every explore_every-th      a stale method (too little recent data), k >= 1, where
                                    its estimate beats off at this batch (else a later turn)
                                                                 exploration
  auto                              best goodput                 goodput / low_acceptance /
                                                                 compute_bound
Of the candidates without enough recent data only one competes in auto: the cold default
(`cold_default`: of the served retrieval methods, suffix and ngram, the one with the least
data, so that each runs about a request and they are then chosen between by what each
measured), so a cold stack starts there, once its replica has measured steps of the request's
batch size (before that: off), rather than on a method it knows nothing about; the others wait
for exploration turns (docs/policy.md, Cold start and load).
In auto, each proposer method is a candidate twice: as chains and as token trees of up to
`auto_branches` children per node (capped by the verifier's --max-num-branches), each priced
from its own measured acceptance (a tree of k nodes forwards k rows and gains its accepted
depth), so that trees are chosen only where they measured better; a request that gives
num_branches keeps it. In-target methods own their shape and are chains here; lookahead is
weighed and run at no fewer nodes than its whole step, window and pool candidates (its
acceptance is measured with both).
Where ngram is served and the request names no range, prompt lookup's shape (Spec-Bench's PLD:
n-grams of 1 to 3 tokens, `PLD_SHAPE`) is one more chain candidate, `ngram[1,3]`: planned as
method ngram with prompt_lookup_min/max set, and priced from its own acceptance, which the
gateway measures from the usage of the requests it ran with the shape (overall and per prompt
class, gateway/estimates.py observe_request), so auto picks it per request where it measured
better than the proposer's own range.

Structured requests: a method that drafts for structured requests only (the grammar's forced
tokens, registry capability `structured_only`) is offered to them alone: for any other request
it is never a candidate, explored or defaulted to; for a structured one it is weighed alone and
first in a hybrid with each served proposer or EAGLE head (hybrid:grammar+suffix,
hybrid:grammar+eagle), and is its cold default.
Load is the running + waiting count of the least-loaded replica: the gateway's own requests in
flight per replica (exact, so a burst is seen at once) plus what that replica's last stats
counted beyond them (other gateways, direct clients). The
batch the goodput model assumes is that load + 1, or the replica's recent mean running count
when that is more.

Each decision's reason is counted in splitspec_policy_decisions_total{decision, reason, method}
and reported in usage.speculation (mode, policy_reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.estimates import Estimates
from protos import verifier_pb2
from splitspec.errors import InvalidArgument
from splitspec.goodput import (
    MethodModel,
    RoundTrip,
    batch_goodput,
    choose,
    class_model,
    default_step_cost,
    prompt_class,
    step_kind,
)
from splitspec.methods import (
    MAX_HYBRID_COMPONENTS,
    METHODS,
    Kind,
    hybrid_name,
    is_method,
    method_served,
    retrieval_based,
    step_kind_of,
    structured_only,
)
from splitspec.params import (
    LOOKAHEAD,
    NGRAM,
    LookaheadParams,
    SpeculationMode,
    SpeculationPlan,
    SpeculationRequest,
    check_lookahead_fits,
    lookahead_step_nodes,
    plan_prompt_lookup,
)
from splitspec.wire import lookahead_from_pb

# Every this many auto decisions, one goes to a stale method (0: never explore): at most ~3 %
# of auto requests, each costing at worst the gap between that method and the best.
EXPLORE_EVERY = 32
# A method is stale for a kind of request (greedy, sampled) below this many recent tried
# draft positions (see gateway/estimates.py for how they decay).
STALE_TRIED = 50.0
# Children per node of the token trees auto weighs against chains (1: chains only).
AUTO_BRANCHES = 3

Candidate = tuple[str, int]  # (method, children per draft node at most: 1 is a chain)

# Prompt lookup's shape auto weighs beside the n-gram proposer's own range: Spec-Bench's PLD
# (evaluation/inference_pld.py) matches n-grams of at most 3 tokens (bench/specbench_configs.py
# "pld"); vLLM's prompt_lookup_min is 1 at its smallest.
PLD_SHAPE = (1, 3)


def shaped_name(lo: int, hi: int) -> str:
    """The candidate name of ngram run at the match range [lo, hi] ("ngram[1,3]", as the
    n-gram proposer describes its own range)."""
    return f"{NGRAM}[{lo},{hi}]"


def _shape_of(name: str) -> tuple[str, tuple[int, int] | None]:
    """(the registry's method, its prompt lookup range) of a candidate name: the name itself
    and None unless it is a shaped ngram (`shaped_name`)."""
    if name.startswith(NGRAM + "[") and name.endswith("]"):
        lo, _, hi = name[len(NGRAM) + 1:-1].partition(",")
        if lo.isdigit() and hi.isdigit():
            return NGRAM, (int(lo), int(hi))
    return name, None


def base_method(name: str) -> str:
    """The registry's method a candidate runs (a shaped ngram runs ngram)."""
    return _shape_of(name)[0]


def plan_candidate(plan: SpeculationPlan) -> str | None:
    """The candidate name a finished request's usage is measured under: its method, or the
    shaped name where it ran ngram alone at a range it asked (or auto chose)."""
    if not plan.enabled:
        return None
    if plan.method == NGRAM and plan.prompt_lookup_min and plan.prompt_lookup_max:
        return shaped_name(plan.prompt_lookup_min, plan.prompt_lookup_max)
    return plan.method


def shaped_candidates(methods: tuple[str, ...], req: SpeculationRequest
                      ) -> tuple[str, ...]:
    """Prompt lookup's shape as a candidate of its own: where ngram is among the methods and
    the request left the range to the deployment."""
    if (NGRAM not in methods or req.prompt_lookup_min is not None
            or req.prompt_lookup_max is not None):
        return ()
    return (shaped_name(*PLD_SHAPE),)


@dataclass(frozen=True)
class PolicyConfig:
    disable_queue_size: int = 0  # 0: no queue-size override
    explore_every: int = EXPLORE_EVERY
    stale_tried: float = STALE_TRIED
    auto_branches: int = AUTO_BRANCHES


@dataclass(frozen=True)
class Load:
    """What the request is about to join."""

    queued: int = 0  # running + waiting on the replica it will most likely go to
    max_num_seqs: int = 0  # that replica's batch limit (0: unknown)
    address: str = ""  # that replica ("" : none known)
    recent_running: float = 0.0  # its running count, averaged over the last seconds

    @property
    def batch(self) -> int:
        """The batch the request will most likely run in: what it joins now, or what the
        replica has been running lately when that is more (a burst's first requests run with
        its last ones)."""
        b = max(self.queued + 1, round(self.recent_running))
        return min(b, self.max_num_seqs) if self.max_num_seqs else b


@dataclass(frozen=True)
class Decision:
    plan: SpeculationPlan  # what the verifier runs (GenerateRequest.speculation_plan)
    reason: str
    mode: SpeculationMode  # as requested


@dataclass
class SpeculationPolicy:
    estimates: Estimates = field(default_factory=Estimates)
    config: PolicyConfig = field(default_factory=PolicyConfig)
    auto_decisions: int = 0
    exploration_held: bool = False  # an exploration turn the batch was too large for

    def decide(self, req: SpeculationRequest, info: verifier_pb2.VerifierInfo,
               greedy: bool = True, load: Load = Load(),
               prompt_tokens: int | None = None, structured: bool = False) -> Decision:
        """prompt_tokens: the request's prompt length (an estimate for text), None unknown: its
        class (goodput.prompt_class) selects the acceptance auto prices each method with.
        structured: the request has a structured output; only then are the methods that draft
        for structured requests alone (the grammar's forced tokens) offered, and first."""
        cls = prompt_class(prompt_tokens) if prompt_tokens is not None else None
        methods = tuple(p.method for p in info.proposers)
        k_max = info.max_num_speculative_tokens
        # the request's one check, against this deployment (a verifier that predates trees
        # reports no branch limit: chains only)
        req.validate(methods, k_max, max(1, info.max_num_branches))
        if not structured:  # never explored, chosen or defaulted to: it would draft nothing
            methods = tuple(m for m in methods if not structured_only(m))
        mode, fixed_k = req.mode, req.num_speculative_tokens

        def plan(chosen: Candidate | None = None, k: int = 0, k_min: int | None = None
                 ) -> SpeculationPlan:
            """k_min set: k is the first step's, re-decided every step from k_min up."""
            name, branches = chosen or (None, 1)
            method, shape = _shape_of(name) if name else (None, None)
            shaped = ({"prompt_lookup_min": shape[0], "prompt_lookup_max": shape[1]}
                      if shape else plan_prompt_lookup(req, method))
            return SpeculationPlan(method, k, adaptive=k_min is not None, k_min=k_min or 0,
                                   num_branches=branches if method else 1,
                                   details=req.details,
                                   lookahead=req.lookahead if method == LOOKAHEAD else None,
                                   **shaped)

        if mode is SpeculationMode.OFF:
            return Decision(plan(), "requested_off", mode)
        if fixed_k == 0:
            return Decision(plan(), "requested_k0", mode)
        unfit = _lookahead_unfit(req, info, k_max) if LOOKAHEAD in methods else None
        if unfit is not None and (req.lookahead is not None or (
                mode is SpeculationMode.ON and req.method == LOOKAHEAD)):
            raise unfit  # what the request itself asks exceeds this deployment's limit
        if unfit is not None:  # the verifier's default shape would be refused: never chosen
            methods = tuple(m for m in methods if m != LOOKAHEAD)
        floors = _lookahead_floor(req, info, k_max) if LOOKAHEAD in methods else {}
        if not methods:
            return Decision(plan(), "no_proposer", mode)
        if mode is SpeculationMode.ON:  # its method (or the first served)
            chosen = (req.method or methods[0], req.num_branches or 1)
            if fixed_k is not None:
                return Decision(plan(chosen, fixed_k), "requested_on", mode)
            _, k, _ = self._choose((chosen,), greedy, load, k_max, None, allow_off=False,
                                   floors=floors, cls=cls)
            return Decision(plan(chosen, k, k_min=max(1, floors.get(chosen[0], 1))),
                            "requested_on", mode)
        if req.method is not None and not method_served(req.method, methods):
            return Decision(plan(), "no_proposer", mode)  # auto's only method cannot run
        candidates = self._candidates((req.method,) if req.method
                                      else methods + _hybrids(methods),
                                      req.num_branches, max(1, info.max_num_branches))
        if req.num_branches in (None, 1):  # prompt lookup's shape: a chain candidate
            candidates += tuple((s, 1) for s in shaped_candidates(
                (req.method,) if req.method else methods, req))
        # a structured request's forced tokens are taken where the grammar forces them: its
        # cold default is the grammar's chain (a step it forces nothing in forwards no row)
        forced = [c for c in candidates if c[1] == 1 and c[0] in METHODS
                  and structured_only(c[0])] if structured else []
        if self.config.disable_queue_size and load.queued >= self.config.disable_queue_size:
            return Decision(plan(), "queue_size", mode)
        if not (load.address and self.estimates.cost_measured(load.address, load.batch)):
            # what a draft row costs in a step of this many sequences is not known yet: plain
            # decoding, which measures it, until it is (docs/policy.md, Cold start and load);
            # a structured request keeps the grammar's forced chain, which drafts only tokens
            # the structure forces and forwards no row in a step where it forces none
            if forced:
                chosen, k, _ = self._choose(forced[:1], greedy, load, k_max, fixed_k,
                                            allow_off=False, floors=floors, cls=cls)
                if chosen is not None:
                    return Decision(plan(chosen, k, k_min=floors.get(chosen[0], 0)
                                         if fixed_k is None else None), "unmeasured_batch", mode)
            return Decision(plan(), "unmeasured_batch", mode)
        self.auto_decisions += 1
        every = self.config.explore_every
        due = every and (self.auto_decisions % every == 0 or self.exploration_held)
        stale = self._stale(candidates, greedy, cls) if due else None
        self.exploration_held = False
        explored = (self._exploration(stale, greedy, load, k_max, fixed_k, floors, cls)
                    if stale is not None else None)
        if explored is not None:
            chosen, k = explored
            return Decision(plan(chosen, k, k_min=max(1, floors.get(chosen[0], 1))
                                 if fixed_k is None else None), "exploration", mode)
        self.exploration_held = stale is not None  # the turn waits for a smaller batch
        candidates = self._competing(candidates, req, greedy,
                                     forced[0] if forced else None)
        chosen, k, reason = self._choose(candidates, greedy, load, k_max, fixed_k,
                                         allow_off=True, floors=floors, cls=cls)
        if chosen is None:
            return Decision(plan(), reason, mode)
        # the verifier re-decides k per step from k_min up (0: it may pause); lookahead keeps
        # its window (its floor): without it, it is not the method that was priced
        return Decision(plan(chosen, k, k_min=floors.get(chosen[0], 0)
                             if fixed_k is None else None), reason, mode)

    def _exploration(self, stale: Candidate, greedy: bool, load: Load, k_max: int,
                     fixed_k: int | None, floors: dict[str, int], cls: str | None
                     ) -> tuple[Candidate, int] | None:
        """The stale candidate and its k for an exploration turn, or None where even its
        estimate (the optimistic prior while it is unmeasured) does not beat off at this
        batch: an explored draft makes every sequence of the step wait for it, and where a
        draft row costs about what a decoding sequence does, a large batch loses whatever the
        draft accepts."""
        chosen, k, _ = self._choose((stale,), greedy, load, k_max, fixed_k, allow_off=True,
                                    floors=floors, cls=cls)
        return (chosen, k) if chosen is not None else None

    def _competing(self, candidates: tuple[Candidate, ...], req: SpeculationRequest,
                   greedy: bool, cold: Candidate | None = None) -> tuple[Candidate, ...]:
        """The candidates auto prices against each other and off: those with enough recent
        data, and of those without, only the one that cannot lose much (`cold_default`: the
        served retrieval methods, each in turn until each is measured, or a structured
        request's forced chain). The others wait for their exploration turns: priced at
        the optimistic prior acceptance they would beat every measured method, and a cold stack
        would try them one after another (a draft model, an EAGLE head, an MLP, lookahead: each
        slower than off on a CPU where a verified row costs 7 % of a step). Without a
        retrieval method served, or for a request that named its method or shape, unmeasured
        registered chains compete at the prior as before; trees and hybrids it did not name
        wait for exploration."""
        def tried(c: Candidate) -> float:
            return self.estimates.acceptance_of(c[0], greedy, c[1]).tried

        def measured(c: Candidate) -> bool:
            return tried(c) >= self.config.stale_tried

        named = req.method is not None or req.num_branches is not None
        if not named and (cold is not None or retrieval_chains(candidates)):
            # None once every retrieval method is measured: the measured ones compete
            cold = cold or cold_default(candidates, tried, self.config.stale_tried)
            return tuple(c for c in candidates if c == cold or measured(c))
        return tuple((m, b) for m, b in candidates
                     if (b == 1 or req.num_branches is not None)
                     and (m in METHODS or m == req.method) or measured((m, b)))

    def _candidates(self, methods: tuple[str, ...], asked_branches: int | None,
                    max_branches: int) -> tuple[Candidate, ...]:
        """What auto weighs: each method as chains, and each proposer method also as trees
        (unless the request fixed num_branches, which it keeps)."""
        if asked_branches is not None:
            return tuple((m, asked_branches) for m in methods)
        b = min(self.config.auto_branches, max_branches)
        trees = tuple((m, b) for m in methods if b > 1 and m in METHODS
                      and (METHODS[m].kind is Kind.PROPOSER
                           or METHODS[m].capabilities.token_trees))
        return tuple((m, 1) for m in methods) + trees

    def _stale(self, candidates: tuple[Candidate, ...], greedy: bool,
               cls: str | None = None) -> Candidate | None:
        """The candidate with the least recent data, when it has too little. A long prompt
        first explores the retrieval candidates (drafts copied from the context, alone or in a
        hybrid) that its class has too little data on: that is where they pay, and the class's
        own acceptance is what prices them for such requests."""
        if cls == "long":
            thin = sorted((self.estimates.class_acceptance(cls, m, greedy, b).tried, (m, b))
                          for m, b in candidates if retrieval_based(base_method(m)))
            if thin and thin[0][0] < self.config.stale_tried:
                return thin[0][1]
        # registered methods before hybrids of them, at equal data
        weights = sorted((self.estimates.acceptance_of(m, greedy, b).tried, m not in METHODS,
                          (m, b)) for m, b in candidates)
        return weights[0][2] if weights and weights[0][0] < self.config.stale_tried else None

    def _choose(self, candidates: tuple[Candidate, ...], greedy: bool, load: Load, k_max: int,
                fixed_k: int | None, allow_off: bool, floors: dict[str, int] | None = None,
                cls: str | None = None) -> tuple[Candidate | None, int, str]:
        """floors: method -> the smallest k it runs as measured (`_lookahead_floor`); cls: the
        request's prompt class, whose own measured acceptance (once it has enough) moves each
        method's model (goodput.class_model): off still has to be beaten by the margin."""
        est = self.estimates
        # plain decoding's own steps and each candidate's, for a step of the batch it will
        # most likely join
        cost = (est.cost(load.address, step_kind(greedy), load.batch, "off") if load.address
                else default_step_cost())
        # each candidate's own steps where it ran enough of them alone (what its proposers
        # cost a step beside its rows), else its kind's (trees cost more than chains)
        kinds = {(m, b): step_kind_of(base_method(m), greedy, b) for m, b in candidates}
        costs = {(m, b): est.cost(load.address, kind, load.batch, base_method(m))
                 for (m, b), kind in kinds.items() if load.address}
        models = {(m, b): MethodModel.from_acceptance(
            est.acceptance_of(m, greedy, b),
            est.round_trip(load.address, base_method(m), load.batch) if load.address
            else RoundTrip(),
            est.draft_limit(load.address, base_method(m))) for m, b in candidates}
        if cls is not None:
            models = {(m, b): class_model(model, est.class_acceptance(cls, m, greedy, b),
                                          self.config.stale_tried,
                                          quoting=cls == "long"
                                          and retrieval_based(base_method(m)))
                      for (m, b), model in models.items()}
        floors = floors or {}
        k_floor = {c: floors[c[0]] for c in candidates if c[0] in floors}
        if fixed_k is None:
            c = choose(models, load.batch, cost, max(k_max, 1), allow_off=allow_off,
                       costs=costs, k_floor=k_floor)
            return c.method, c.k, c.reason
        best = max(candidates, key=lambda c: (batch_goodput(models[c], fixed_k, load.batch,
                                                            costs.get(c, cost)), c))
        if allow_off:  # auto with an explicit k: that k, or off
            c = choose({best: models[best]}, load.batch, cost, k_max, True, costs=costs,
                       k_floor=k_floor)
            if c.method is None:
                return None, 0, c.reason
        return best, fixed_k, "goodput"


def _retrieval(methods: tuple[str, ...]) -> list[str]:
    """The served retrieval methods (drafts copied from the context), the cross-request ones
    first: a suffix tree over every answer served drafts only where its match is frequent, so
    it goes before prompt lookup in a gated chain (Spec-Bench, real model: suffix, else n-gram
    1.38x off against 1.28x and 1.22x for each alone)."""
    found = [m for m in methods if m in METHODS and METHODS[m].capabilities.copies_context]
    return sorted(found, key=lambda m: not METHODS[m].capabilities.cross_request)


def _hybrids(methods: tuple[str, ...]) -> tuple[str, ...]:
    """The hybrids auto weighs beside single methods: each served retrieval method (its
    candidates first) merged with each served model-backed drafter, e.g. hybrid:suffix+eagle;
    and gated (`|`: a later tier drafts only where the earlier ones drafted too little): every
    served retrieval method in one chain, e.g. hybrid:suffix|ngram, and the first retrieval
    method before each model-backed drafter, e.g. hybrid:suffix|eagle."""
    retrieval = _retrieval(methods)
    models = [m for m in methods if m in METHODS and METHODS[m].capabilities.needs_model]
    names = [hybrid_name(r, m) for r in retrieval for m in models]
    if len(retrieval) > 1:
        names.append(hybrid_name(*retrieval[:MAX_HYBRID_COMPONENTS], gated=True))
    names += [hybrid_name(retrieval[0], m, gated=True) for m in models if retrieval]
    # served only to structured requests (decide drops them for the rest): the grammar's
    # forced tokens first, merged with each served proposer's drafts (hybrid:grammar+suffix)
    # and an EAGLE head's (hybrid:grammar+eagle; lookahead's window joins no hybrid)
    forced = [m for m in methods if m in METHODS and structured_only(m)]
    names += [hybrid_name(f, m) for f in forced for m in methods
              if m in METHODS and not structured_only(m)]
    return tuple(n for n in names if is_method(n))


def retrieval_chains(candidates: tuple[Candidate, ...]) -> list[Candidate]:
    """The retrieval methods among the candidates as chains, each alone (the cross-request one
    first): what a cold stack runs. Their gated chain (hybrid:suffix|ngram) is explored like
    any hybrid: it drafts on more steps, and each extra row it verifies costs what the
    context makes it (on two cores about 1 ms at 150 cached tokens, 2 at 600), so where it
    pays depends on the machine and the traffic, and it competes once measured."""
    chains = [(m, b) for m, b in candidates if b == 1 and m in METHODS
              and METHODS[m].capabilities.copies_context and step_kind_of(m, True) != "tree"]
    return sorted(chains, key=lambda c: (not METHODS[c[0]].capabilities.cross_request,
                                         chains.index(c)))


def cold_default(candidates: tuple[Candidate, ...], tried, enough: float
                 ) -> Candidate | None:
    """The retrieval method auto prices while it is unmeasured: of `retrieval_chains`, the one
    with the least recent data (`tried(candidate)`: its recently tried positions) while it has
    fewer than `enough`, so that a cold stack runs each of them for a request or so and then
    chooses between them by what each measured, its acceptance and its own steps' cost. None
    once all are measured, or when none is served. Each cannot lose much: a step it finds
    nothing to copy for forwards no draft row and waits ~1 ms for its proposer, and the
    verifier's per-step k pauses a request whose own drafts fail."""
    unmeasured = [(tried(c), i, c) for i, c in enumerate(retrieval_chains(candidates))
                  if tried(c) < enough]
    return min(unmeasured)[2] if unmeasured else None


def _lookahead_shape(req: SpeculationRequest, info: verifier_pb2.VerifierInfo
                     ) -> LookaheadParams | None:
    """The lookahead shape the verifier would run for this request: the request's fields over
    the verifier's defaults; None when a verifier that predates reporting its defaults leaves
    it unknown."""
    asked = req.lookahead or LookaheadParams()
    if info.HasField("lookahead_default"):
        asked = asked.over(lookahead_from_pb(info.lookahead_default))
    return None if asked.window is None or asked.ngram is None else asked


def _lookahead_floor(req: SpeculationRequest, info: verifier_pb2.VerifierInfo,
                     k_max: int) -> dict[str, int]:
    """{lookahead: its whole step's draft nodes} for the shape it would run (within the node
    limit): a step feeds the window only when k holds it, and the G pool candidates, which are
    what lookahead accepts, only in the room k leaves beside it; its acceptance is measured
    with both, so auto prices and runs it at no smaller k. (A floor of the window alone left
    the candidates no room: 1.05 tokens per step against 2.1.) Empty when unknown."""
    shape = _lookahead_shape(req, info)
    if shape is None:
        return {}
    return {LOOKAHEAD: min(lookahead_step_nodes(shape.window, shape.ngram, shape.guesses or 0),
                           k_max)}


def _lookahead_unfit(req: SpeculationRequest, info: verifier_pb2.VerifierInfo,
                    k_max: int) -> InvalidArgument | None:
    """Why the verifier would refuse lookahead for this request (the shape it would run has a
    window above its node limit); None when it fits, or when the shape is unknown."""
    asked = _lookahead_shape(req, info)
    if asked is None:
        return None
    try:
        check_lookahead_fits(asked, k_max)
    except InvalidArgument as exc:
        return exc
    return None


__all__ = ["PLD_SHAPE", "Decision", "Load", "PolicyConfig", "SpeculationPolicy",
           "base_method", "cold_default", "plan_candidate", "retrieval_chains",
           "shaped_candidates", "shaped_name"]
