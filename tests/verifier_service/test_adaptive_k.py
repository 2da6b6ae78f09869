"""Per-step k for adaptive requests (verifier_service/drafts/adaptive_k.py) and the engine counters
it and the gateway's policy read: acceptance apart for greedy and sampled requests, proposer round
trips, step time by batch tokens. Adaptive greedy requests stay lossless."""

from __future__ import annotations

import asyncio

import planted_bugs as bug
import pytest
from engine_testlib import PROMPTS, make_engine, request, run_all

import verifier_service.drafts.adaptive_k as adaptive_k
from gateway.stats_watch import snapshot_from_pb
from protos import common_pb2
from splitspec.errors import InvalidArgument
from splitspec.goodput import Acceptance
from splitspec.params import SamplingParams, SpeculationPlan
from splitspec.wire import plan_to_pb
from verifier_service.drafts.adaptive_k import PROBE_AFTER
from verifier_service.servicer import VerifierServicer, _stats_to_pb
from verifier_service.telemetry.stats import EngineStats


def adaptive(inp, k: int = 3, k_min: int = 0, method: str = "ngram"):
    return type(inp)(inp.request_id, inp.prompt_token_ids, inp.sampling, inp.stopping,
                     SpeculationPlan(method, k, adaptive=True, k_min=k_min))


def flat_then_steep(engine) -> None:
    """Step times: ~10 ms up to 16 tokens (memory-bound), 2 ms per token beyond."""
    for tokens, seconds in ((1, 0.010), (8, 0.0102), (16, 0.0105), (64, 0.105)):
        for _ in range(5):
            engine.stats.add_step_cost(tokens, seconds)


def decoding(engine, rid: str, inp_k: int = 0):
    seq = engine.add_request(request(engine, rid, PROMPTS[0], k=inp_k))
    seq.num_computed = len(seq.tokens) - 1  # as if its prompt were cached: decoding
    return seq


@pytest.fixture
def engine(target_model_dir):
    e = make_engine(target_model_dir, max_num_seqs=32, max_num_speculative_tokens=8)
    flat_then_steep(e)
    return e


def test_high_acceptance_drafts_more_low_acceptance_pauses(engine):
    seq = engine.add_request(adaptive(request(engine, "a", PROMPTS[0])))
    seq.num_computed = len(seq.tokens) - 1
    seq.accepted, seq.rejections = 95, 5
    high = engine.adaptive.choose(seq, [seq])
    assert high >= 6
    seq.accepted, seq.rejections = 0, 60
    assert engine.adaptive.choose(seq, [seq]) == 0
    # paused: nothing new is learnt, so every PROBE_AFTER paused steps it drafts once
    ks = [engine.adaptive.choose(seq, [seq]) for _ in range(PROBE_AFTER * 2)]
    assert ks[:PROBE_AFTER - 1] == [0] * (PROBE_AFTER - 1)
    assert ks[PROBE_AFTER - 1] >= 1 and ks[PROBE_AFTER:] == [0] * PROBE_AFTER
    on = engine.add_request(adaptive(request(engine, "b", PROMPTS[1]), k_min=1))
    on.num_computed = len(on.tokens) - 1
    on.accepted, on.rejections = 0, 60
    engine.adaptive.begin_step()
    assert engine.adaptive.choose(on, [on]) >= 1  # mode on: drafting never pauses


def test_a_compute_bound_batch_pauses_drafting(engine):
    seq = engine.add_request(adaptive(request(engine, "a", PROMPTS[0])))
    seq.num_computed = len(seq.tokens) - 1
    seq.accepted, seq.rejections = 60, 40
    assert engine.adaptive.choose(seq, [seq]) > 0
    others = [decoding(engine, f"o{i}") for i in range(15)]
    engine.adaptive.begin_step()
    assert engine.adaptive.choose(seq, [seq, *others]) == 0


def test_sequences_that_all_paused_share_the_round_trip_and_draft_together(target_model_dir):
    """A batch of 16 planned with one method, none of which drafted last step: one sequence
    drafting alone would make the whole step wait for the proposer, which its own draft does
    not repay; all of them drafting share that wait, and the batch gains. They must not stay
    paused for each other."""
    engine = make_engine(target_model_dir, max_num_seqs=32, max_num_speculative_tokens=8)
    for tokens, seconds in ((1, 0.010), (16, 0.0105), (64, 0.012)):  # memory-bound throughout
        for _ in range(5):
            engine.stats.add_step_cost(tokens, seconds)
    engine.stats.method("ngram").round_trips = {3: [100, 100 * 0.008]}  # an 8 ms round trip
    batch = [engine.add_request(adaptive(request(engine, f"s{i}", PROMPTS[i % len(PROMPTS)])))
             for i in range(16)]
    for seq in batch:
        seq.num_computed = len(seq.tokens) - 1
        seq.accepted, seq.rejections = 90, 10
    assert all(engine.adaptive.choose(seq, batch) > 0 for seq in batch)
    # alone (the others not planned with it), the same sequence waits for the proposer alone
    plain = [decoding(engine, f"p{i}") for i in range(15)]
    engine.adaptive.begin_step()
    assert engine.adaptive.choose(batch[0], [batch[0], *plain]) == 0


def test_an_in_target_methods_drafting_is_each_sequences_own_wait(target_model_dir):
    """The batch above, planned with an in-target method whose drafting costs the same 8 ms:
    it drafts sequence by sequence inside the verifier, so no wait is shared; each sequence
    pays its own, which its draft does not repay here."""
    engine = make_engine(target_model_dir, max_num_seqs=32, max_num_speculative_tokens=8)
    for tokens, seconds in ((1, 0.010), (16, 0.0105), (64, 0.012)):
        for _ in range(5):
            engine.stats.add_step_cost(tokens, seconds)
    for method in ("ngram", "lookahead"):
        engine.stats.method(method).round_trips = {3: [100, 100 * 0.008]}
    batch = {m: [engine.add_request(adaptive(request(engine, f"{m}{i}", PROMPTS[i % 3]),
                                             method=m)) for i in range(16)]
             for m in ("ngram", "lookahead")}
    for seq in batch["ngram"] + batch["lookahead"]:
        seq.num_computed = len(seq.tokens) - 1
        seq.accepted, seq.rejections = 90, 10
    assert engine.adaptive.method_model("lookahead", True).round_trip.per_sequence
    assert not engine.adaptive.method_model("ngram", True).round_trip.per_sequence
    assert all(engine.adaptive.choose(seq, batch["ngram"]) > 0 for seq in batch["ngram"])
    engine.adaptive.begin_step()
    assert all(engine.adaptive.choose(seq, batch["lookahead"]) == 0
               for seq in batch["lookahead"])


def test_the_request_history_outweighs_the_method_prior(engine):
    counts = engine.stats.method("ngram").greedy
    counts.accepted_tokens, counts.rejections = 10, 990  # the method is bad on this verifier
    seq = engine.add_request(adaptive(request(engine, "a", PROMPTS[0])))
    seq.num_computed = len(seq.tokens) - 1
    assert engine.adaptive.choose(seq, [seq]) == 0
    seq.accepted, seq.rejections = 180, 20  # but this request's drafts are good
    assert engine.adaptive.choose(seq, [seq]) > 0
    sampled = engine.add_request(adaptive(request(engine, "s", PROMPTS[1], sampling=SamplingParams(
        temperature=0.8))))
    sampled.num_computed = len(sampled.tokens) - 1
    assert engine.adaptive.acceptance(sampled) == pytest.approx(0.7)  # no sampled data: prior


def test_adaptive_greedy_is_lossless_and_counters_are_kept_apart(target_model_dir):
    engine = make_engine(target_model_dir, max_num_seqs=8)
    base = asyncio.run(run_all(engine, [request(engine, f"b{i}", p) for i, p in
                                        enumerate(PROMPTS[:3])]))
    engine = make_engine(target_model_dir, max_num_seqs=8)
    sampled = request(engine, "s", PROMPTS[0], k=3,
                      sampling=SamplingParams(temperature=0.5, seed=7))
    runs = asyncio.run(run_all(engine, [adaptive(request(engine, f"a{i}", p)) for i, p in
                                        enumerate(PROMPTS[:3])] + [sampled]))
    for (tokens, _, _), (want, _, _) in zip(runs, base):
        assert tokens == want
    ngram = engine.stats.method("ngram")
    assert ngram.greedy.drafts > 0 and ngram.sampled.drafts > 0
    assert ngram.greedy.proposed_tokens + ngram.sampled.proposed_tokens == ngram.proposed_tokens
    assert sum(r[2].usage.proposed_tokens for r in runs[3:]) == ngram.sampled.proposed_tokens
    assert 0 < sum(n for n, _ in ngram.round_trips.values()) <= ngram.steps
    assert ngram.greedy.asked >= ngram.greedy.drafts > 0
    # decoding steps only: the prefill step of the batch is not a point of the cost model
    assert 0 < sum(b.steps for b in engine.stats.step_cost) < engine.stats.steps
    assert sum(b.tokens_total for b in engine.stats.step_cost) < engine.stats.generated_tokens + \
        sum(ngram.proposed_tokens for ngram in engine.stats.per_method.values())


def test_the_verifier_runs_the_gateways_plan_and_resolves_a_direct_clients_config(engine):
    servicer = VerifierServicer(engine, "target", "", "cpu", "float32")

    def plan(**fields):
        return asyncio.run(servicer._from_pb(common_pb2.GenerateRequest(
            token_ids=common_pb2.TokenIds(ids=[1, 2]), **fields))).speculation

    for sent in (SpeculationPlan("ngram", 3, adaptive=True, k_min=0),
                 SpeculationPlan("ngram", 3, adaptive=True, k_min=1),
                 SpeculationPlan("ngram", 3, details=True), SpeculationPlan()):
        assert plan(speculation_plan=plan_to_pb(sent)) == sent  # taken as it is
    # a direct client without a plan: its config resolved here, k fixed for every step
    direct = plan(speculation=common_pb2.SpeculationConfig(
        mode=common_pb2.SPECULATION_MODE_AUTO, method="ngram", details=True))
    assert direct == SpeculationPlan("ngram", engine.config.default_num_speculative_tokens,
                                     details=True)
    with pytest.raises(InvalidArgument, match="speculation.method"):
        plan(speculation=common_pb2.SpeculationConfig(method="medusa"))


def test_a_plan_beyond_what_this_verifier_serves_is_refused(engine):
    with pytest.raises(InvalidArgument, match="num_speculative_tokens.*<= 8"):
        engine.add_request(adaptive(request(engine, "big", PROMPTS[0]), k=9))
    with pytest.raises(InvalidArgument, match="speculation.method.*not served"):
        engine.add_request(adaptive(request(engine, "draft", PROMPTS[0]), method="draft"))


def test_the_gateway_reads_the_counts_the_verifier_models_from():
    stats = EngineStats()
    ngram = stats.method("ngram")
    for k, accepted, greedy in ((3, 3, True), (3, 1, True), (2, 0, False), (4, 2, True)):
        ngram.add_draft(k, accepted, greedy)
        (ngram.greedy if greedy else ngram.sampled).add_asked(k, k, accepted)
    ngram.add_round_trip(3, 0.002)
    ngram.add_round_trip(4, 0.003)
    mine = ngram.counts()
    wire = snapshot_from_pb(_stats_to_pb(stats)).methods["ngram"]
    assert (wire.greedy, wire.sampled, wire.round_trips, wire.longest_draft) == (
        mine.greedy, mine.sampled, mine.round_trips, mine.longest_draft)
    assert mine.greedy == Acceptance(6, 8, 3, 0, (3, 3, 3, 1), (3, 3, 3, 1), (3, 2, 1))


def test_the_curve_and_models_are_refitted_every_sixteenth_of_the_steps(engine):
    """Refitting costs host time every step while one step barely moves the fit: it happens
    once REFIT_SHARE of the steps so far were added (every step at first)."""
    adaptive, stats = engine.adaptive, engine.stats
    stats.steps = 320  # refit every 20 steps
    adaptive.begin_step()
    curve, model = adaptive.step_cost(), adaptive.method_model("ngram", True)
    stats.steps += 19
    adaptive.begin_step()
    assert adaptive.step_cost() is curve and adaptive.method_model("ngram", True) is model
    stats.steps += 1
    adaptive.begin_step()
    assert adaptive.step_cost() is not curve
    assert adaptive.method_model("ngram", True) is not model


def test_a_step_of_many_sequences_is_priced_on_their_own_steps_and_sent_so(engine):
    """Steps are kept apart by their class of sequence counts too: a sequence running among 12
    others reads the 9-16 class's curve, which the verifier also sends (WatchStats)."""
    stats, adaptive = engine.stats, engine.adaptive
    for tokens, seconds, seqs in ((16, 0.030, 16), (40, 0.034, 16), (16, 0.012, 4),
                                  (40, 0.060, 4)):
        for _ in range(5):
            stats.add_step_cost(tokens, seconds, "greedy", seqs)
    stats.steps = 1
    adaptive.begin_step()
    assert adaptive.step_cost("greedy", 13)(40) == pytest.approx(0.034)
    assert adaptive.step_cost("greedy", 4)(40) == pytest.approx(0.060)
    assert adaptive.step_cost("greedy")(40) == pytest.approx(0.047)  # every step by tokens
    sent = snapshot_from_pb(_stats_to_pb(stats)).step_cost_by_seqs
    assert ("greedy", 16, 5, 200.0, pytest.approx(0.17)) in sent and len(sent) == 4


def test_a_methods_own_steps_price_its_k_and_are_sent_so(engine):
    check_a_methods_own_steps_price_its_k(engine)


def test_step_costs_that_ignore_the_method_fail_the_check(engine, monkeypatch):
    bug.step_costs_ignore_the_method(monkeypatch)
    with pytest.raises(AssertionError):
        check_a_methods_own_steps_price_its_k(engine)


def check_a_methods_own_steps_price_its_k(engine):
    """Steps one method ran alone are kept apart by it too: a method whose proposer drafts
    beside the forward costs its own steps more than their rows do. A sequence planned with
    it is priced on them (where its drafts no longer pay, it pauses), another method on the
    curve of every step of its class; a step of several methods is in no method's curve; the
    verifier sends them (WatchStats)."""
    stats, ks = engine.stats, engine.adaptive
    seq = engine.add_request(adaptive(request(engine, "a", PROMPTS[0])))
    seq.num_computed = len(seq.tokens) - 1
    seq.accepted, seq.rejections = 50, 50

    def measured(steps) -> int:
        for tokens, seconds, method in steps:
            for _ in range(5):
                stats.add_step_cost(tokens, seconds, "greedy", 1, method)
        stats.steps += 1000
        ks.begin_step()
        return ks.choose(seq, [seq])

    # plain steps, and steps of several methods: n-gram's drafts pay on the class's curve
    assert measured(((1, 0.010, "off"), (5, 0.011, ""))) > 0
    # n-gram's own steps, its proposer drafting beside the forward: 4 rows cost 30 ms
    assert measured(((1, 0.010, "ngram"), (5, 0.040, "ngram"))) == 0
    assert ks.step_cost("greedy", 1, "ngram")(5) == pytest.approx(0.040)
    assert ks.step_cost("greedy", 1, "off")(1) == pytest.approx(0.010)
    # a method without steps of its own: every one-sequence step's, by tokens
    assert ks.step_cost("greedy", 1, "suffix")(5) == pytest.approx(0.0255)
    sent = snapshot_from_pb(_stats_to_pb(stats)).step_cost_by_method
    assert ("ngram", "greedy", 1, 5, 25.0, pytest.approx(0.2)) in sent and len(sent) == 3


def test_round_trips_are_kept_by_the_steps_sequences_and_sent_so(engine):
    """A method's answers are kept apart by how many sequences the step asked it for too: the
    per-step k of a sequence among 12 others reads the 9-16 class's fit, which the verifier
    sends (WatchStats)."""
    stats, adaptive = engine.stats, engine.adaptive
    method = stats.method("ngram")
    for seqs, seconds in ((1, 0.010), (16, 0.002)):
        for _ in range(10):
            method.add_round_trip(3, seconds, seqs=seqs)
    stats.steps = 1
    adaptive.begin_step()
    assert adaptive.method_model("ngram", True, 1, 13).round_trip(3) == pytest.approx(0.002)
    assert adaptive.method_model("ngram", True, 1, 1).round_trip(3) == pytest.approx(0.010)
    assert adaptive.method_model("ngram", True).round_trip(3) == pytest.approx(0.006)
    sent = snapshot_from_pb(_stats_to_pb(stats)).methods["ngram"]
    assert sorted(sent.round_trips_by_seqs) == [(3, 1, 10.0, pytest.approx(0.1)),
                                                (3, 16, 10.0, pytest.approx(0.02))]


def check_pauses_only_where_pausing_pays_by_the_margin(engine, monkeypatch) -> None:
    """A request pauses (k = 0) only where that is expected to beat its best k >= 1 by
    PAUSE_MARGIN: the rows a pause saves are priced at the curve's mean slope, and on a CPU they
    cost nothing inside a tile of rows."""
    seq = engine.add_request(adaptive(request(engine, "a", PROMPTS[0])))
    seq.num_computed = len(seq.tokens) - 1
    for pausing, want_paused in ((1.03, False), (1.2, True)):
        monkeypatch.setattr(adaptive_k, "marginal_goodput",
                            lambda model, k, *rest, g=pausing: g if k == 0 else 1.0 + k * 1e-4)
        engine.adaptive.begin_step()
        got = engine.adaptive.choose(seq, [seq])
        assert (got == 0) == want_paused, (pausing, got)


def test_a_request_pauses_only_where_pausing_pays_by_the_margin(engine, monkeypatch):
    check_pauses_only_where_pausing_pays_by_the_margin(engine, monkeypatch)


def test_pausing_on_any_gain_fails_the_margin_check(engine, monkeypatch):
    bug.pause_margin_ignored(monkeypatch)
    with pytest.raises(AssertionError):
        check_pauses_only_where_pausing_pays_by_the_margin(engine, monkeypatch)
