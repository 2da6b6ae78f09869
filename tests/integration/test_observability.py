"""Observability through the three real services (gateway, verifier, n-gram proposer), each its
own process with tracing on (OTLP/gRPC to a sink this test runs) and metrics on free ports:

* one REST request is one trace: the spans of all three services share its trace id (the one
  in the request's traceparent header), every span's parent is in the trace and encloses it,
  and the gateway span carries the GenAI attributes;
* after a known workload each service's /metrics adds up: accepted <= drafted, accepted per
  position sums to accepted, emitted tokens = completion tokens of the responses;
* every dashboard query returns data from a real Prometheus scraping the stack (skipped where
  the `prometheus` binary is not installed; `make e2e-metrics` installs it).
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from testdata import PROMPTS

from protos import common_pb2, generation_pb2_grpc
from splitspec.launcher import Stack, StackConfig
from splitspec.net import free_port
from splitspec.telemetry import dashboards
from splitspec.telemetry.otlp_sink import OtlpSink

pytestmark = pytest.mark.integration

SERVICES = {"splitspec-gateway", "splitspec-verifier", "splitspec-proposer-ngram"}


class TracedStack(Stack):
    """A Stack whose services export their spans to `sink` quickly."""

    def __init__(self, config: StackConfig, sink: OtlpSink):
        super().__init__(config)
        self._otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                      "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_BSP_SCHEDULE_DELAY": "100",
                      "OTEL_TRACES_SAMPLER": "parentbased_always_on"}

    def environment(self) -> dict[str, str]:
        return {**Stack.environment(), **self._otel}


@pytest.fixture(scope="module")
def sink():
    with OtlpSink() as s:
        yield s


@pytest.fixture(scope="module")
def stack(target_model_dir, tmp_path_factory, sink):
    config = StackConfig.with_free_ports(model=target_model_dir, device="cpu",
                                         log_dir=tmp_path_factory.mktemp("observed-stack"),
                                         verifier_args=["--threads", "1"])
    with TracedStack(config, sink) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack):
    with httpx.Client(base_url=stack.url, timeout=120) as c:
        yield c


def scrape(stack: Stack) -> dict[str, dict[tuple, float]]:
    """Service name -> {(sample name, sorted labels): value}."""
    out = {}
    for name, url in stack.metrics_urls.items():
        text = httpx.get(url, timeout=10).text
        out[name] = {(s.name, tuple(sorted(s.labels.items()))): s.value
                     for f in text_string_to_metric_families(text) for s in f.samples}
    return out


def total(samples: dict[tuple, float], name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == v2 for k, v2 in labels.items()))


def complete_trace(spans, names: set[str], services: set[str] = SERVICES) -> bool:
    """All services and `names` present, and every span's parent arrived but one root's."""
    ids = {s.span_id for s in spans}
    return ({s.service for s in spans} >= services and names <= {s.name for s in spans}
            and any(s.name == "text_completion target" for s in spans)
            and sum(1 for s in spans if s.parent_span_id not in ids) == 1)


def complete(client, prompt, spec, max_tokens=24, **extra):
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                             "temperature": 0, "speculation": spec, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_one_request_is_one_trace_across_the_three_services(stack, client, sink):
    trace_id, caller = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    r = client.post("/v1/completions", headers={"traceparent": f"00-{trace_id}-{caller}-01"},
                    json={"prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0,
                          "speculation": {"mode": "on", "method": "ngram",
                                          "num_speculative_tokens": 3}})
    assert r.status_code == 200, r.text
    sink.store.wait_for(lambda ss: complete_trace([s for s in ss if s.trace_id == trace_id],
                                                  {"splitspec.verifier.decode"}), 30)
    spans = sink.store.trace(trace_id)
    assert {s.service for s in spans} == SERVICES
    by_id = {s.span_id: s for s in spans}
    (root,) = [s for s in spans if s.parent_span_id not in by_id]
    assert root.parent_span_id == caller  # the REST traceparent header was honoured
    assert (root.service, root.name, root.kind) == ("splitspec-gateway",
                                                    "text_completion target", "SERVER")
    for s in spans:  # nesting: every child inside its parent (1 ms of clock slack)
        if s is not root:
            parent = by_id[s.parent_span_id]
            assert parent.start_ns - 1_000_000 <= s.start_ns, (s.name, parent.name)
            assert s.end_ns <= parent.end_ns + 1_000_000, (s.name, parent.name)

    def chain(span) -> list[tuple[str, str]]:
        """(service, span name) from the root down to `span`."""
        path = [span]
        while path[-1] is not root:
            path.append(by_id[path[-1].parent_span_id])
        return [(x.service.removeprefix("splitspec-"), x.name) for x in reversed(path)]

    proposer = [s for s in spans if s.service == "splitspec-proposer-ngram"]
    assert proposer and all(s.name == "splitspec.proposer.propose" for s in proposer)
    assert chain(proposer[0]) == [
        ("gateway", "text_completion target"),
        ("gateway", "/splitspec.v1.Verifier/Generate"),  # gRPC client span
        ("verifier", "/splitspec.v1.Verifier/Generate"),  # gRPC server span
        ("verifier", "splitspec.verifier.request"),
        ("proposer-ngram", "splitspec.proposer.propose")]
    request = by_id[proposer[0].parent_span_id]
    phases = {s.name: s for s in spans if s.parent_span_id == request.span_id
              and s.service == "splitspec-verifier"}
    assert set(phases) == {"splitspec.verifier.queue", "splitspec.verifier.prefill",
                           "splitspec.verifier.decode"}
    steps = phases["splitspec.verifier.decode"].events
    assert steps and all({"splitspec.step.k", "splitspec.step.accepted",
                          "splitspec.step.seconds"} <= set(e.attributes) for e in steps)
    a = root.attributes
    usage = r.json()["usage"]
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.request.model"] == r.json()["model"]
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"],
            a["gen_ai.request.top_p"]) == (16, 0.0, 1.0)
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
        usage["prompt_tokens"], usage["completion_tokens"])
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["splitspec.speculation.method"] == "ngram"


def test_grpc_metadata_carries_the_callers_context(stack, sink):
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4737"
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}") as ch:
        chunks = list(generation_pb2_grpc.GenerationStub(ch).Generate(
            common_pb2.GenerateRequest(text=PROMPTS[2],
                                       sampling=common_pb2.SamplingParams(temperature=0),
                                       stopping=common_pb2.StoppingCriteria(max_tokens=8)),
            metadata=[("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01")], timeout=60))
    assert chunks[-1].usage.completion_tokens == 8
    sink.store.wait_for(lambda ss: complete_trace(
        [s for s in ss if s.trace_id == trace_id], {"splitspec.verifier.decode"},
        SERVICES - {"splitspec-proposer-ngram"}), 30)  # auto speculation: maybe no drafts
    mine = sink.store.trace(trace_id)
    server = next(s for s in mine if s.service == "splitspec-gateway" and s.kind == "SERVER")
    assert server.name == "/splitspec.v1.Generation/Generate"
    assert server.parent_span_id == "00f067aa0ba902b7"
    genai = next(s for s in mine if s.name == "text_completion target")
    assert genai.parent_span_id == server.span_id


def test_metrics_add_up_after_a_known_workload(stack, client):
    before = scrape(stack)
    specs = [{"mode": "on", "method": "ngram", "num_speculative_tokens": k, "details": True}
             for k in (2, 3, 5)] + [{"mode": "off"}]
    jobs = [(p, s) for p in PROMPTS[:4] for s in specs]
    with ThreadPoolExecutor(4) as pool:  # concurrent: the verifier batches them
        results = list(pool.map(lambda job: complete(client, job[0], job[1]), jobs))
    after = scrape(stack)
    completion = sum(r["usage"]["completion_tokens"] for r in results)
    v0, v1 = before["verifier"], after["verifier"]
    g0, g1 = before["gateway"], after["gateway"]
    p0, p1 = before["proposer-ngram"], after["proposer-ngram"]

    def delta(old, new, name, **labels):
        return total(new, name, **labels) - total(old, name, **labels)

    # since start (the earlier tests' requests included)
    accepted = total(v1, "splitspec_spec_decode_num_accepted_tokens_total")
    assert accepted <= total(v1, "splitspec_spec_decode_num_proposed_tokens_total")
    assert total(v1, "splitspec_spec_decode_num_accepted_tokens_per_pos_total") == accepted
    # this workload's share
    drafted = delta(v0, v1, "splitspec_spec_decode_num_proposed_tokens_total", method="ngram")
    accepted = delta(v0, v1, "splitspec_spec_decode_num_accepted_tokens_total", method="ngram")
    per_pos = delta(v0, v1, "splitspec_spec_decode_num_accepted_tokens_per_pos_total",
                    method="ngram")
    drafts = delta(v0, v1, "splitspec_spec_decode_num_drafts_total", method="ngram")
    assert 0 < accepted <= drafted and per_pos == accepted and 0 < drafts <= drafted
    assert drafts * 5 >= drafted  # no draft longer than the largest k asked for
    assert accepted == sum(r["usage"]["speculation"]["accepted_tokens"] for r in results)
    assert drafted == sum(r["usage"]["speculation"]["proposed_tokens"] for r in results)
    assert delta(v0, v1, "splitspec_generation_tokens_total") == completion
    assert delta(v0, v1, "splitspec_request_generation_tokens_total") == completion
    assert delta(v0, v1, "splitspec_request_success_total") == len(jobs)
    assert delta(g0, g1, "splitspec_gateway_generation_tokens_total") == completion
    assert delta(g0, g1, "splitspec_gateway_generation_tokens_total", method="none") == \
        sum(r["usage"]["completion_tokens"] for r, (_, s) in zip(results, jobs)
            if s["mode"] == "off")
    assert delta(g0, g1, "splitspec_policy_decisions_total") == len(jobs)
    assert delta(g0, g1, "splitspec_gateway_requests_total", api="rest", code="200") == len(jobs)
    # every step that asked the proposer got exactly one message answered
    assert delta(p0, p1, "splitspec_proposer_propose_messages_total") == \
        delta(v0, v1, "splitspec_spec_decode_proposer_steps_total", method="ngram")
    assert delta(p0, p1, "splitspec_proposer_proposed_tokens_total") >= drafted
    assert total(v1, "splitspec_kv_cache_blocks_used") == 0  # idle again: nothing held
    for r in results:  # per-request details add up too
        spec = r["usage"]["speculation"]
        if spec["method"] is None:
            continue
        assert sum(spec["accepted_per_position"]) == spec["accepted_tokens"]
        assert sum(d for d, _ in spec["step_counts"]) == spec["proposed_tokens"]
        assert sum(a for _, a in spec["step_counts"]) == spec["accepted_tokens"]
        assert len(spec["step_counts"]) == spec["steps"]


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus is not installed (make e2e-metrics installs it)")
def test_every_dashboard_query_returns_data_from_a_real_prometheus(stack, client):
    targets = {name: [url.removeprefix("http://").removesuffix("/metrics")]
               for name, url in stack.metrics_urls.items()}
    with dashboards.PrometheusServer(targets, free_port(), interval_s=0.5) as prom:
        prom.wait_for_scrapes(2)
        for p in PROMPTS[:3]:
            complete(client, p, {"mode": "on", "method": "ngram", "num_speculative_tokens": 3})
            complete(client, p, {"mode": "off"}, max_tokens=8)
        prom.wait_for_scrapes(3)
        dash = dashboards.load(dashboards.METRICS_DASHBOARD)
        empty = [f"{q.panel} ({q.ref_id})" for q in dashboards.prometheus_queries(dash)
                 if not prom.query(dashboards.substitute(q.expr, {"__rate_interval": "30s"}))]
    assert not empty, f"no data for: {empty}"
