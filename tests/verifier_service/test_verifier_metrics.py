"""The verifier's Prometheus exporter, fed synthetic StepStats and RequestTimelines: vLLM's
speculation counters under splitspec_ (per method, per draft position), misses by reason,
latency histograms, gauges from the engine snapshot, and a per-step cost that allocates
nothing once a method's counters exist."""

from __future__ import annotations

import tracemalloc

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from verifier_service.telemetry.metrics import VerifierMetrics
from verifier_service.telemetry.stats import (
    EngineStats,
    MethodStepStats,
    RequestTimeline,
    StepStats,
)


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def step(per_method: dict[str, MethodStepStats], emitted: int = 1, seconds: float = 0.02):
    return StepStats(start=100.0, seconds=seconds, num_seqs=2, num_tokens=8,
                     emitted_tokens=emitted, per_method=per_method)


def mstats(drafts: int, k: int, accepted: list[int], rtt: float | None = 0.003,
           missed: bool = False) -> MethodStepStats:
    """`drafts` drafts of k tokens; accepted[i] tokens accepted of draft i."""
    per_pos = [sum(1 for a in accepted if a > j) for j in range(k)] if drafts else []
    return MethodStepStats(proposed_tokens=drafts * k, accepted_tokens=sum(accepted),
                           drafts=drafts,
                           accepted_per_position=per_pos, round_trip_s=rtt, missed=missed)


def test_speculation_counters_mirror_vllm_and_add_up():
    registry = CollectorRegistry()
    m = VerifierMetrics(registry)
    m.on_step(step({"ngram": mstats(2, 3, [3, 1])}, emitted=6))
    m.on_step(step({"ngram": mstats(1, 4, [2]), "draft": mstats(1, 2, [0])}, emitted=4))
    m.on_step(step({"ngram": mstats(0, 0, [], rtt=None, missed=True)}, emitted=1))
    s = scrape(registry)
    ng = (("method", "ngram"),)
    assert s[("splitspec_spec_decode_num_drafts_total", ng)] == 3
    assert s[("splitspec_spec_decode_num_proposed_tokens_total", ng)] == 10
    # the old name stays exported (deprecated) with the same samples
    assert s[("splitspec_spec_decode_num_draft_tokens_total", ng)] == 10
    assert s[("splitspec_spec_decode_branch_hits_total", ng)] == 0  # chains only
    assert s[("splitspec_spec_decode_num_accepted_tokens_total", ng)] == 6
    per_pos = {dict(k[1])["position"]: v for k, v in s.items()
               if k[0] == "splitspec_spec_decode_num_accepted_tokens_per_pos_total"
               and dict(k[1])["method"] == "ngram"}
    assert per_pos == {"0": 3, "1": 2, "2": 1, "3": 0}  # drafts with >= j+1 accepted
    assert sum(per_pos.values()) == s[("splitspec_spec_decode_num_accepted_tokens_total", ng)]
    assert s[("splitspec_spec_decode_num_accepted_tokens_total", (("method", "draft"),))] == 0
    assert s[("splitspec_spec_decode_proposer_misses_total",
              (("method", "ngram"), ("reason", "late")))] == 1
    assert s[("splitspec_spec_decode_proposer_steps_total", ng)] == 3
    assert s[("splitspec_generation_tokens_total", ())] == 11
    assert s[("splitspec_engine_step_seconds_count", ())] == 3
    assert s[("splitspec_spec_decode_proposer_round_trip_seconds_count", ng)] == 2


def test_request_timelines_feed_latency_histograms_and_finish_counters():
    registry = CollectorRegistry()
    m = VerifierMetrics(registry)
    m.on_request_done(RequestTimeline("a", "ngram", arrival=10.0, admitted=10.5,
                                      first_token=11.0, finished=13.0, finish_reason="length",
                                      prompt_tokens=7, completion_tokens=5))
    m.on_request_done(RequestTimeline("b", None, arrival=10.0, finished=10.2,
                                      finish_reason="abort", prompt_tokens=3))
    m.on_request_done(RequestTimeline("c", None, arrival=10.0, admitted=10.0, finished=10.1,
                                      finish_reason="error", prompt_tokens=2))
    s = scrape(registry)
    assert s[("splitspec_time_to_first_token_seconds_sum", ())] == 1.0
    assert s[("splitspec_time_per_output_token_seconds_sum", ())] == 0.5  # 2 s / 4 tokens
    assert s[("splitspec_request_queue_time_seconds_count", ())] == 2
    assert s[("splitspec_e2e_request_latency_seconds_count", ())] == 3
    assert s[("splitspec_request_success_total", (("finished_reason", "length"),))] == 1
    assert s[("splitspec_request_success_total", (("finished_reason", "abort"),))] == 1
    assert s[("splitspec_request_failures_total", ())] == 1
    assert s[("splitspec_prompt_tokens_total", ())] == 12
    assert s[("splitspec_request_generation_tokens_total", (("method", "ngram"),))] == 5
    assert s[("splitspec_request_generation_tokens_total", (("method", "none"),))] == 0


def test_gauges_come_from_the_engine_snapshot_at_scrape_time():
    registry = CollectorRegistry()
    m = VerifierMetrics(registry)
    assert ("splitspec_num_requests_running", ()) not in scrape(registry)  # not bound yet
    snap = EngineStats(running=3, waiting=2, kv_blocks_total=100, kv_blocks_free=75,
                       preemptions=4, prefix_cache_queries=500, prefix_cache_hits=320,
                       prefix_cache_blocks=30, prefix_cache_evictions=7,
                       grammar_pruned_tokens=9, structured_requests={"json_schema": 4, "regex": 1},
                       grammar_compiles=2, grammar_compile_seconds=0.5, grammar_cache_hits=3)
    m.bind(lambda: snap)
    s = scrape(registry)
    assert s[("splitspec_num_requests_running", ())] == 3
    assert s[("splitspec_num_requests_waiting", ())] == 2
    assert s[("splitspec_kv_cache_blocks_used", ())] == 25
    assert s[("splitspec_kv_cache_blocks_total", ())] == 100
    assert s[("splitspec_kv_cache_usage_perc", ())] == 0.25
    assert s[("splitspec_num_preemptions_total", ())] == 4
    # prefix caching, in prompt tokens (vLLM's prefix_cache_queries / prefix_cache_hits)
    assert s[("splitspec_prefix_cache_queries_total", ())] == 500
    assert s[("splitspec_prefix_cache_hits_total", ())] == 320
    assert s[("splitspec_prefix_cache_evictions_total", ())] == 7
    assert s[("splitspec_prefix_cache_blocks", ())] == 30
    assert s[("splitspec_structured_output_pruned_draft_tokens_total", ())] == 9
    kind = "splitspec_structured_output_requests_total"
    assert s[(kind, (("kind", "json_schema"),))] == 4 and s[(kind, (("kind", "regex"),))] == 1
    assert s[("splitspec_structured_output_grammar_compiles_total", ())] == 2
    assert s[("splitspec_structured_output_grammar_compile_seconds_total", ())] == 0.5
    assert s[("splitspec_structured_output_grammar_cache_hits_total", ())] == 3


def test_in_target_methods_stats_are_counters_and_gauges_labelled_by_method():
    registry = CollectorRegistry()
    m = VerifierMetrics(registry)
    snap = EngineStats(in_target={"lookahead": {"window_nodes_total": 12, "pool_ngrams": 40}})
    m.bind(lambda: snap)
    s = scrape(registry)
    la = (("method", "lookahead"),)
    assert s[("splitspec_in_target_window_nodes_total", la)] == 12
    assert s[("splitspec_in_target_pool_ngrams", la)] == 40


def test_a_step_allocates_nothing_once_its_methods_are_known():
    m = VerifierMetrics(CollectorRegistry())
    st = step({"ngram": mstats(4, 4, [4, 2, 0, 1]), "mlp": mstats(2, 3, [3, 3])}, emitted=9)
    for _ in range(100):
        m.on_step(st)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(5000):
            m.on_step(st)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(d.size_diff for d in after.compare_to(before, "filename")
                if d.traceback[0].filename.endswith(("verifier_service/telemetry/metrics.py",
                                                     "prometheus_client/metrics.py",
                                                     "prometheus_client/values.py")))
    assert grown < 2048, grown  # small ints and floats only; nothing kept per step


def test_token_trees_branch_hits_are_counted_per_method():
    registry = CollectorRegistry()
    m = VerifierMetrics(registry)
    tree = MethodStepStats(proposed_tokens=12, accepted_tokens=5, drafts=2, branch_hits=1,
                           accepted_per_position=[2, 2, 1])
    m.on_step(step({"draft": tree}, emitted=7))
    s = scrape(registry)
    dr = (("method", "draft"),)
    assert s[("splitspec_spec_decode_branch_hits_total", dr)] == 1
    assert s[("splitspec_spec_decode_num_proposed_tokens_total", dr)] == 12  # nodes verified
