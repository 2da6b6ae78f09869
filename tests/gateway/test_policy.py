"""The gateway's speculation policy on synthetic verifier stats: what `auto` picks for high and
low acceptance and for a compute-bound batch, the queue-size override, the explicit modes, greedy
and sampled kept apart, deterministic exploration, and the estimates built from snapshots."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.estimates import Estimates, MethodSnapshot, ReplicaSnapshot
from gateway.policy import PLD_SHAPE, Load, PolicyConfig, SpeculationPolicy, shaped_name
from gateway.stats_watch import snapshot_from_pb
from protos import common_pb2, verifier_pb2
from splitspec.errors import InvalidArgument
from splitspec.goodput import Acceptance
from splitspec.params import SpeculationMode, SpeculationRequest
from splitspec.wire import plan_to_pb

INFO = verifier_pb2.VerifierInfo(
    model="target", max_model_len=512, default_num_speculative_tokens=4,
    max_num_speculative_tokens=8,
    proposers=[verifier_pb2.ProposerStatus(method="ngram"),
               verifier_pb2.ProposerStatus(method="mlp")])
ADDRESS = "replica-0"
# (kind, steps, tokens total, seconds total) per bucket: 10 ms up to 16 tokens, then 1 ms per
# token.
COST = tuple(("greedy", *b) for b in ((100, 100.0, 1.0), (100, 800.0, 1.05), (100, 1600.0, 1.1),
                                     (100, 6400.0, 6.0)))
AUTO = SpeculationRequest()


def snapshot(steps: int = 400, running: int = 0, waiting: int = 0,
             greedy: dict[str, tuple[float, float]] | None = None,
             sampled: dict[str, tuple[float, float]] | None = None,
             round_trip_s: float = 0.001) -> ReplicaSnapshot:
    """A replica's stats with the given (accepted, tried) positions per method."""
    greedy, sampled = greedy or {}, sampled or {}
    def counts(acc_tried: tuple[float, float]) -> Acceptance:  # every step got a draft
        drafts = acc_tried[1] - acc_tried[0]
        return Acceptance(*acc_tried, drafts, drafts)

    methods = {m: MethodSnapshot(counts(greedy.get(m, (0, 0))), counts(sampled.get(m, (0, 0))),
                                 ((3, 100.0, round_trip_s * 100),))
               for m in ("ngram", "mlp", *greedy, *sampled)}
    return ReplicaSnapshot(running, waiting, 16, steps, methods, COST)


def policy(snap: ReplicaSnapshot, **config) -> SpeculationPolicy:
    est = Estimates()
    est.observe(ADDRESS, snap)
    config.setdefault("explore_every", 0)
    return SpeculationPolicy(est, PolicyConfig(**config))


def load(queued: int = 0) -> Load:
    return Load(queued, 16, ADDRESS)


def test_high_acceptance_picks_speculation_with_a_larger_k():
    high = policy(snapshot(greedy={"mlp": (900, 1000), "ngram": (300, 1000)}))
    moderate = policy(snapshot(greedy={"mlp": (500, 1000), "ngram": (300, 1000)}))
    d_high, d_mod = high.decide(AUTO, INFO, True, load()), moderate.decide(AUTO, INFO, True,
                                                                            load())
    assert (d_high.plan.method, d_high.reason) == ("mlp", "goodput")
    assert (d_mod.plan.method, d_mod.reason) == ("mlp", "goodput")
    assert d_high.plan.k > d_mod.plan.k >= 1
    assert d_high.plan.adaptive and d_high.plan.k_min == 0
    pb = plan_to_pb(d_high.plan)  # k_min 0: the verifier may pause drafting per step
    assert (pb.method, pb.k, pb.adaptive, pb.k_min) == ("mlp", d_high.plan.k, True, 0)


def test_low_acceptance_picks_off():
    p = policy(snapshot(greedy={"mlp": (20, 1000), "ngram": (10, 1000)}))
    d = p.decide(AUTO, INFO, True, load())
    assert (d.plan.enabled, d.reason) == (False, "low_acceptance")
    assert plan_to_pb(d.plan) == common_pb2.SpeculationPlan()  # no method, k 0: off


def test_a_compute_bound_batch_picks_off():
    p = policy(snapshot(greedy={"mlp": (600, 1000), "ngram": (300, 1000)}))
    assert p.decide(AUTO, INFO, True, load(0)).plan.method == "mlp"
    d = p.decide(AUTO, INFO, True, load(15))
    assert (d.plan.enabled, d.reason) == (False, "compute_bound")


def test_a_burst_is_judged_by_the_batch_the_replica_has_been_running():
    p = policy(snapshot(greedy={"mlp": (600, 1000), "ngram": (300, 1000)}))
    # nothing queued right now, but the replica has been running 16: the burst's first request
    # will run with the rest of it
    d = p.decide(AUTO, INFO, True, Load(0, 16, ADDRESS, recent_running=15.6))
    assert (d.plan.enabled, d.reason) == (False, "compute_bound")
    est = Estimates()
    est.observe(ADDRESS, snapshot(steps=1, running=10))
    est.observe(ADDRESS, snapshot(steps=2, running=0))
    assert est.recent_running[ADDRESS] == pytest.approx(8.0)

def test_a_replica_load_counts_what_this_gateway_did_not_send_it():
    est = Estimates()
    est.observe(ADDRESS, snapshot(running=5, waiting=2), local_in_flight=4)
    assert est.load(ADDRESS) == 7 and est.others_load(ADDRESS) == 3
    est.observe(ADDRESS, snapshot(steps=500, running=1), local_in_flight=3)  # stale: ours left
    assert est.others_load(ADDRESS) == 0


def test_the_queue_size_override_wins_over_goodput():
    p = policy(snapshot(greedy={"mlp": (990, 1000)}), disable_queue_size=2)
    assert p.decide(AUTO, INFO, True, load(1)).plan.method == "mlp"
    d = p.decide(AUTO, INFO, True, load(2))
    assert (d.plan.enabled, d.reason) == (False, "queue_size")
    # an explicit request is not overridden
    on = SpeculationRequest(SpeculationMode.ON, "ngram", 3)
    assert p.decide(on, INFO, True, load(5)).plan.k == 3


def test_a_method_that_never_drafts_more_than_3_tokens_gets_k_3():
    snap = snapshot(greedy={"mlp": (900, 1000), "ngram": (10, 1000)})
    mlp = snap.methods["mlp"]
    snap.methods["mlp"] = MethodSnapshot(mlp.greedy, mlp.sampled, ((8, 100.0, 0.1),),
                                         longest_draft=3)
    d = policy(snap).decide(AUTO, INFO, True, load())
    assert (d.plan.method, d.plan.k) == ("mlp", 3)


def test_on_with_method_and_k_is_honoured_exactly():
    p = policy(snapshot(greedy={"ngram": (10, 1000), "mlp": (900, 1000)}))
    d = p.decide(SpeculationRequest(SpeculationMode.ON, "ngram", 7), INFO, True, load(15))
    assert (d.plan.method, d.plan.k, d.reason, d.plan.adaptive) == (
        "ngram", 7, "requested_on", False)
    pb = plan_to_pb(d.plan)
    assert (pb.method, pb.k, pb.adaptive) == ("ngram", 7, False)


def test_on_without_k_lets_the_policy_pick_k_for_that_method():
    p = policy(snapshot(greedy={"ngram": (10, 1000), "mlp": (900, 1000)}))
    d = p.decide(SpeculationRequest(SpeculationMode.ON, "ngram"), INFO, True, load(15))
    assert d.plan.method == "ngram" and d.plan.k >= 1  # on: never off, whatever the model says
    assert (d.reason, d.plan.adaptive, d.plan.k_min) == ("requested_on", True, 1)
    assert plan_to_pb(d.plan).k_min == 1  # on: drafting never pauses
    hi = p.decide(SpeculationRequest(SpeculationMode.ON, "mlp"), INFO, True, load(0))
    assert hi.plan.k > d.plan.k
    # no method: the first served, as before, even where another would do better
    first = p.decide(SpeculationRequest(SpeculationMode.ON), INFO, True, load(0))
    assert first.plan.method == "ngram" and first.plan.k >= 1 and first.plan.adaptive
    fixed = p.decide(SpeculationRequest(SpeculationMode.ON, num_speculative_tokens=6), INFO)
    assert (fixed.plan.method, fixed.plan.k, fixed.plan.adaptive) == ("ngram", 6, False)


def test_off_k0_and_no_proposer():
    p = policy(snapshot(greedy={"mlp": (900, 1000)}))
    assert p.decide(SpeculationRequest(SpeculationMode.OFF), INFO).reason == "requested_off"
    assert p.decide(SpeculationRequest(num_speculative_tokens=0), INFO).reason == "requested_k0"
    bare = verifier_pb2.VerifierInfo(max_num_speculative_tokens=8)
    assert p.decide(AUTO, bare).reason == "no_proposer"
    with pytest.raises(InvalidArgument):
        p.decide(SpeculationRequest(SpeculationMode.ON), bare)


@pytest.mark.parametrize("req, field", [
    (SpeculationRequest(method="medusa"), "speculation.method"),  # not a registered method
    (SpeculationRequest(method="suffix"), "speculation.method"),  # registered, not served
    (SpeculationRequest(num_speculative_tokens=-1), "speculation.num_speculative_tokens"),
    (SpeculationRequest(num_speculative_tokens=9), "speculation.num_speculative_tokens"),
])
def test_the_policy_is_where_a_request_is_validated(req, field):
    """The one place the values are checked (the REST and gRPC parsers check JSON and wire
    types only): unknown or unserved methods, k out of range or above the deployment's limit."""
    with pytest.raises(InvalidArgument) as e:
        policy(snapshot()).decide(req, INFO)
    assert e.value.field == field


def test_greedy_and_sampled_acceptance_are_kept_apart():
    p = policy(snapshot(greedy={"mlp": (900, 1000), "ngram": (300, 1000)},
                        sampled={"mlp": (30, 1000), "ngram": (10, 1000)}))
    assert p.decide(AUTO, INFO, True, load()).plan.method == "mlp"
    d = p.decide(AUTO, INFO, False, load())
    assert (d.plan.enabled, d.reason) == (False, "low_acceptance")


def test_auto_with_a_method_only_considers_that_method():
    p = policy(snapshot(greedy={"mlp": (900, 1000), "ngram": (500, 1000)}))
    d = p.decide(SpeculationRequest(method="ngram"), INFO, True, load())
    assert d.plan.method == "ngram" and d.reason == "goodput"


def test_exploration_is_deterministic_and_goes_to_the_stale_method():
    # ngram has no recent data: every 4th auto decision tries it, with drafting forced on
    p = policy(snapshot(greedy={"mlp": (900, 1000)}), explore_every=4)
    decisions = [p.decide(AUTO, INFO, True, load()) for _ in range(8)]
    assert [d.reason for d in decisions] == ["goodput"] * 3 + ["exploration"] + \
        ["goodput"] * 3 + ["exploration"]
    explored = decisions[3]
    assert explored.plan.method == "ngram" and explored.plan.k >= 1 and explored.plan.k_min == 1
    # once every method (and the hybrids and prompt lookup's shape auto weighs with them) has
    # enough data nothing is stale: no exploration
    fresh = policy(snapshot(greedy={"mlp": (900, 1000), "ngram": (300, 1000),
                                    "hybrid:ngram+mlp": (300, 1000),
                                    "hybrid:ngram|mlp": (300, 1000),
                                    shaped_name(*PLD_SHAPE): (300, 1000)}), explore_every=4)
    assert all(fresh.decide(AUTO, INFO, True, load()).reason == "goodput" for _ in range(8))


def test_estimates_use_differences_between_snapshots_and_decay_old_counts():
    est = Estimates(half_life_tried=1000.0)
    est.observe(ADDRESS, snapshot(steps=10, greedy={"ngram": (100, 200), "mlp": (0, 0)}))
    assert est.acceptance_of("ngram", True) == Acceptance(100, 200, 100, 100)
    # mlp drafts 1000 positions: ngram's old counts lose half their weight
    est.observe(ADDRESS, snapshot(steps=20, greedy={"ngram": (100, 200), "mlp": (800, 1000)}))
    assert est.acceptance_of("ngram", True).tried == pytest.approx(100)
    assert est.acceptance_of("mlp", True) == Acceptance(800, 1000, 200, 200)
    assert est.acceptance_of("mlp", False) == Acceptance()
    # a restarted replica (counters went back) counts from zero again
    est.observe(ADDRESS, snapshot(steps=5, greedy={"mlp": (8, 10)}))
    assert est.acceptance_of("mlp", True).tried == pytest.approx(1000 * 0.5 ** (10 / 1000) + 10)
    assert est.round_trip(ADDRESS, "mlp")(3) == pytest.approx(0.001)
    assert est.load(ADDRESS) == 0 and est.cost(ADDRESS)(1) == pytest.approx(0.01)


def test_snapshot_from_the_wire():
    pb = verifier_pb2.EngineStats(
        running=3, waiting=2, steps=7, max_num_seqs=8,
        methods=[verifier_pb2.MethodStats(
            method="ngram", greedy=verifier_pb2.AcceptanceCounts(
                drafts=4, accepted_tokens=6, rejections=4, asked=9, asked_at=[9, 9, 5],
                drafted_at=[4, 3, 1], accepted_at=[3, 2, 1]),
            round_trips=[verifier_pb2.RoundTripBucket(k=3, calls=5, seconds_total=0.5)],
            round_trips_by_seqs=[verifier_pb2.RoundTripBucket(k=3, calls=5, seconds_total=0.5,
                                                              max_seqs=2)],
            longest_draft=2)],
        step_cost=[verifier_pb2.StepCostBucket(max_tokens=1, steps=3, tokens_total=3,
                                               seconds_total=0.03),
                   verifier_pb2.StepCostBucket(max_tokens=8, steps=2, tokens_total=14,
                                               seconds_total=0.05, kind="tree")],
        step_cost_by_seqs=[verifier_pb2.StepCostBucket(max_tokens=8, steps=2, tokens_total=12,
                                                       seconds_total=0.04, max_seqs=4)])
    snap = snapshot_from_pb(pb)
    assert snap.step_cost_by_seqs == (("greedy", 4, 2, 12.0, 0.04),)
    assert (snap.running, snap.waiting, snap.max_num_seqs, snap.steps) == (3, 2, 8, 7)
    assert snap.methods["ngram"].greedy == Acceptance(6, 10, 4, 9, (9, 9, 5), (4, 3, 1),
                                                      (3, 2, 1))
    assert snap.methods["ngram"].round_trips == ((3, 5.0, 0.5),)
    assert snap.methods["ngram"].round_trips_by_seqs == ((3, 2, 5.0, 0.5),)
    assert snap.methods["ngram"].longest_draft == 2
    assert snap.methods["ngram"].draft_limit() == 0  # 4 drafts: too few to tell
    assert snap.step_cost == (("greedy", 3, 3.0, 0.03), ("tree", 2, 14.0, 0.05))


def test_every_plan_carries_the_requests_details_flag():
    p = policy(snapshot(greedy={"mlp": (900, 1000)}))
    for req in (SpeculationRequest(details=True),
                SpeculationRequest(SpeculationMode.OFF, details=True),
                SpeculationRequest(SpeculationMode.ON, "ngram", 3, details=True)):
        assert p.decide(req, INFO, True, load()).plan.details
    assert not p.decide(AUTO, INFO, True, load()).plan.details


def test_auto_picks_token_trees_where_they_measured_better_and_chains_where_not():
    info = verifier_pb2.VerifierInfo()
    info.CopyFrom(INFO)
    info.max_num_branches = 4  # auto weighs trees of min(auto_branches 3, 4) children

    def snap(chain: tuple[float, float], tree: tuple[float, float]) -> ReplicaSnapshot:
        """n-gram's (accepted, tried) as chains and as trees of 3; the MLP never pays."""
        s = snapshot(greedy={"ngram": chain, "mlp": (10, 1000)})
        drafts = tree[1] - tree[0]
        trees = ((3, Acceptance(*tree, drafts, drafts), Acceptance()),)
        return dataclasses.replace(s, methods={
            **s.methods, "ngram": dataclasses.replace(s.methods["ngram"], trees=trees)})

    better = policy(snap((300, 1000), (700, 1000))).decide(AUTO, info, True, load())
    assert (better.plan.method, better.plan.num_branches, better.reason) == ("ngram", 3,
                                                                             "goodput")
    worse = policy(snap((700, 1000), (300, 1000)))
    chosen = worse.decide(AUTO, info, True, load())
    assert (chosen.plan.method, chosen.plan.num_branches) == ("ngram", 1)
    # the MLP's trees were never measured: not chosen on priors, but explored
    assert worse.decide(SpeculationRequest(method="mlp"), info, True, load()).plan.method is None
    explorer = policy(snap((700, 1000), (300, 1000)), explore_every=1)
    d = explorer.decide(AUTO, info, True, load())
    assert (d.plan.method, d.plan.num_branches, d.reason) == ("mlp", 3, "exploration")
    kept = worse.decide(SpeculationRequest(num_branches=2), info, True, load())
    assert kept.plan.num_branches == 2  # a request's own num_branches is kept
    assert plan_to_pb(better.plan).num_branches == 3


def test_auto_weighs_eagle_trees_beside_its_chains():
    """EAGLE (in the target, token trees) is priced as chains and as trees like a proposer."""
    info = verifier_pb2.VerifierInfo()
    info.CopyFrom(INFO)
    info.max_num_branches = 4
    info.proposers.append(verifier_pb2.ProposerStatus(method="eagle"))

    def snap(chain: tuple[float, float], tree: tuple[float, float]) -> ReplicaSnapshot:
        s = snapshot(greedy={"ngram": (10, 1000), "mlp": (10, 1000)})
        drafts = chain[1] - chain[0], tree[1] - tree[0]
        eagle = MethodSnapshot(Acceptance(*chain, drafts[0], drafts[0]), Acceptance(), (),
                               trees=((3, Acceptance(*tree, drafts[1], drafts[1]),
                                       Acceptance()),))
        return dataclasses.replace(s, methods={**s.methods, "eagle": eagle})

    trees = policy(snap((300, 1000), (700, 1000))).decide(AUTO, info, True, load())
    assert (trees.plan.method, trees.plan.num_branches, trees.reason) == ("eagle", 3, "goodput")
    chains = policy(snap((700, 1000), (300, 1000))).decide(AUTO, info, True, load())
    assert (chains.plan.method, chains.plan.num_branches) == ("eagle", 1)


def test_tree_counts_travel_from_the_verifier_s_stats_to_the_estimates():
    tree = verifier_pb2.AcceptanceCounts(drafts=10, proposed_tokens=60, accepted_tokens=25,
                                         rejections=9, asked=10)
    pb = verifier_pb2.EngineStats(steps=5, methods=[verifier_pb2.MethodStats(
        method="ngram", trees=[verifier_pb2.TreeCounts(branches=3, greedy=tree)])])
    snap = snapshot_from_pb(pb)
    assert snap.methods["ngram"].acceptance(True, 3) == Acceptance.from_counters(tree)
    est = Estimates()
    est.observe(ADDRESS, snap)
    assert est.acceptance_of("ngram", True, 3).accepted == 25
    assert est.acceptance_of("ngram", True).accepted == 0  # chains are kept apart


def _with_lookahead(greedy: Acceptance) -> tuple[verifier_pb2.VerifierInfo, ReplicaSnapshot]:
    """A replica serving lookahead (window 3, n-gram 3, 2 guesses) with the given greedy
    acceptance, beside weak n-gram and MLP proposers."""
    info = verifier_pb2.VerifierInfo()
    info.CopyFrom(INFO)
    info.proposers.append(verifier_pb2.ProposerStatus(method="lookahead"))
    info.lookahead_default.CopyFrom(common_pb2.LookaheadConfig(window=3, ngram=3, guesses=2))
    snap = snapshot(greedy={"mlp": (100, 1000), "ngram": (100, 1000)})
    good = MethodSnapshot(greedy, Acceptance(), ())
    return info, dataclasses.replace(snap, methods={**snap.methods, "lookahead": good})

def test_auto_prices_and_runs_lookahead_with_its_whole_step_never_below_it():
    """Lookahead's acceptance is measured with its Jacobi window (which feeds its pool) and the
    pool's candidates beside it, and a step feeds the window only when k holds it (W x (N - 1)
    nodes), the candidates only in the room left ((W + G) x (N - 1) nodes in all): auto weighs
    lookahead at that many nodes or more, and the plan keeps the verifier's per-step k there
    too (tests/gateway/test_policy_lookahead.py checks the verifier's drafting at that k)."""
    info, snap = _with_lookahead(Acceptance(900, 1000, 100, 100))
    d = policy(snap).decide(AUTO, info, True, load())
    assert (d.plan.method, d.reason) == ("lookahead", "goodput")
    floor = min(10, info.max_num_speculative_tokens)  # (3 + 2) x (3 - 1) nodes, or the limit
    assert info.max_num_speculative_tokens > 6  # above the window's 3 x (3 - 1) alone
    assert d.plan.k >= floor and d.plan.k_min == floor, d.plan
    on = policy(snap).decide(SpeculationRequest(mode=SpeculationMode.ON, method="lookahead"),
                             info, True, load())
    assert on.plan.k >= floor and on.plan.k_min == floor, on.plan


def test_auto_prices_lookahead_with_the_tree_steps_it_runs():
    """Lookahead's drafts are always trees (its window and guesses), so its steps run the tree
    sampler: auto prices it with the tree steps' measured cost even as a chain candidate. With
    tree steps as cheap as chains it takes lookahead; at 5x their cost it does not."""
    info, snap = _with_lookahead(Acceptance(600, 1000, 400, 400))

    def with_tree_cost(factor: float) -> ReplicaSnapshot:
        trees = tuple(("tree", n, t, s * factor) for _, n, t, s in COST)
        return dataclasses.replace(snap, step_cost=COST + trees)

    cheap = policy(with_tree_cost(1.0)).decide(AUTO, info, True, load())
    assert cheap.plan.method == "lookahead", cheap
    dear = policy(with_tree_cost(5.0)).decide(AUTO, info, True, load())
    assert dear.plan.method != "lookahead", dear
