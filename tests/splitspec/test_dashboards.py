"""The dashboards in k8s/splitspec/dashboards/: every PromQL expression parses (promql-parser)
and names only metrics the services export; the traces dashboard queries Tempo for span names
and attributes the services set. (`make e2e-metrics` evaluates the same queries against a real
Prometheus.)"""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from proposer_service.telemetry.metrics import ProposerMetrics
from splitspec.telemetry import dashboards
from verifier_service.telemetry.metrics import VerifierMetrics
from verifier_service.telemetry.stats import EngineStats, MethodStepStats, StepStats

SPAN_SOURCES = ["gateway/tracing.py", "verifier_service/telemetry/tracing.py",
                "proposer_service/telemetry/tracing.py"]


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Every sample name the three services' exporters can produce."""
    registry = CollectorRegistry()
    GatewayMetrics(registry, lambda: {"127.0.0.1:50051": 0}, lambda: 0,
                   lambda: {"prefix_hit": 0})
    verifier = VerifierMetrics(registry, lambda: EngineStats(kv_blocks_total=8))
    verifier.on_step(StepStats(0.0, 0.01, 1, 4, 2, {"ngram": MethodStepStats(
        3, 1, 1, [1, 0, 0], 0.002)}))
    ProposerMetrics(registry, "ngram")
    return dashboards.exported_names(registry.collect())


@pytest.fixture(scope="module")
def metrics_dashboard() -> dict:
    return dashboards.load(dashboards.METRICS_DASHBOARD)


def test_every_promql_expression_parses_and_names_exported_metrics(metrics_dashboard,
                                                                    exported):
    queries = dashboards.prometheus_queries(metrics_dashboard)
    assert len(queries) >= 20
    for q in queries:
        names = dashboards.metric_names(dashboards.substitute(q.expr))
        assert names, f"{q.panel}: selects no metric"
        assert names <= exported, f"{q.panel} ({q.ref_id}): unknown {sorted(names - exported)}"
    for name in dashboards.variable_metrics(metrics_dashboard):
        assert name in exported


def test_the_dashboard_covers_what_operators_ask_for(metrics_dashboard):
    text = " ".join(q.expr for q in dashboards.prometheus_queries(metrics_dashboard))
    for needed in ["splitspec_spec_decode_num_accepted_tokens_per_pos_total",  # by position
                   "splitspec_spec_decode_num_drafts_total",  # mean accepted length
                   "splitspec_policy_decisions_total", "splitspec_time_to_first_token_seconds",
                   "splitspec_time_per_output_token_seconds", "splitspec_kv_cache_blocks_used",
                   "splitspec_spec_decode_proposer_round_trip_seconds",
                   'splitspec_gateway_generation_tokens_total{method!="none"}',
                   "splitspec_prefix_cache_hits_total", "splitspec_prefix_cache_queries_total",
                   "splitspec_gateway_routing_decisions_total"]:
        assert needed in text, needed


def test_a_query_with_a_typo_is_caught(exported):
    with pytest.raises(ValueError):
        dashboards.metric_names("sum(rate(splitspec_generation_tokens_total[1m])")
    names = dashboards.metric_names(dashboards.substitute(
        "rate(splitspec_spec_decode_num_draft_token_total{method=~\"$method\"}[$__rate_interval])"))
    assert not names <= exported


def test_traces_dashboard_queries_spans_the_services_emit():
    dash = dashboards.load(dashboards.TRACES_DASHBOARD)
    sources = "".join((dashboards.REPO_ROOT / p).read_text() for p in SPAN_SOURCES)
    targets = [t for p in dash["panels"] for t in p.get("targets", [])]
    assert targets and all(t["datasource"]["type"] == "tempo" for t in targets)
    traceql = " ".join(t["query"] for t in targets)
    assert any(p["type"] == "traces" for p in dash["panels"])  # the per-step timeline
    for name in re.findall(r'(?<![.\w])name = "([^"]+)"', traceql):
        assert f'"{name}"' in sources, name
    for attr in re.findall(r"\bspan\.([a-z_][\w.]*)", traceql):
        assert f'"{attr}"' in sources, attr
    services = set(re.findall(r'resource\.service\.name = "([^"]+)"', traceql))
    assert services <= {"splitspec-gateway", "splitspec-verifier"}
