"""Tracing is configured only by the standard OTEL_* variables: off when nothing is set, OTLP
over gRPC or HTTP/protobuf to the endpoint given, the service name and sampler from the
environment. Spans really arrive at an OTLP receiver (the test's own sink) over both
protocols."""

from __future__ import annotations

import pytest

from splitspec.telemetry import tracing
from splitspec.telemetry.otlp_sink import OtlpSink, format_trace
from splitspec.telemetry.tracing import TraceSettings, build_provider, settings_from_env


@pytest.mark.parametrize("env, expected", [
    ({}, TraceSettings()),
    ({"OTEL_SERVICE_NAME": "x"}, TraceSettings()),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4317"}, TraceSettings(("otlp",), "grpc")),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces",
      "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
     TraceSettings(("otlp",), "http/protobuf")),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318", "OTEL_EXPORTER_OTLP_PROTOCOL":
      "http/protobuf"}, TraceSettings(("otlp",), "http/protobuf")),
    ({"OTEL_TRACES_EXPORTER": "console"}, TraceSettings(("console",), "grpc")),
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, TraceSettings(("otlp", "console"), "grpc")),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4317"},
     TraceSettings()),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4317"},
     TraceSettings()),
])
def test_settings_come_only_from_the_standard_variables(env, expected):
    assert settings_from_env(env) == expected
    assert settings_from_env(env).enabled == bool(expected.exporters)


@pytest.mark.parametrize("env, name", [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
     "OTEL_EXPORTER_OTLP_PROTOCOL"),
])
def test_unsupported_settings_are_refused_by_name(env, name):
    with pytest.raises(ValueError, match=name):
        settings_from_env(env)


def test_nothing_set_means_no_tracing_at_all():
    assert tracing.setup_tracing("splitspec-test", environ={}) is None
    assert tracing.active() is None
    assert tracing.server_interceptors() == [] and tracing.channel_interceptors() == []


def _export_one_span(monkeypatch, env: dict[str, str], default_name: str = "svc-default"):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    provider = build_provider(settings_from_env(), default_name)
    with provider.get_tracer("t").start_as_current_span("hello", attributes={"a": 1}):
        pass
    assert provider.force_flush(10_000)
    provider.shutdown()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_spans_reach_an_otlp_receiver_over_either_protocol(monkeypatch, protocol):
    for k in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER"):
        monkeypatch.delenv(k, raising=False)
    with OtlpSink(http_port=0) as sink:
        endpoint = sink.endpoint if protocol == "grpc" else sink.http_endpoint
        _export_one_span(monkeypatch, {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                                       "OTEL_EXPORTER_OTLP_PROTOCOL": protocol})
        spans = sink.store.wait_for(lambda s: len(s) >= 1, 10)
    assert [(s.name, s.service, s.attributes) for s in spans] == [("hello", "svc-default",
                                                                    {"a": 1})]
    assert format_trace(spans).startswith("svc-default | hello | +0.0 ms")


def test_service_name_and_sampler_follow_the_environment(monkeypatch):
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    with OtlpSink() as sink:
        _export_one_span(monkeypatch, {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                                       "OTEL_SERVICE_NAME": "my-gateway"})
        assert [s.service for s in sink.store.wait_for(lambda s: len(s) >= 1, 10)] == \
            ["my-gateway"]
        sink.store.clear()
        _export_one_span(monkeypatch, {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                                       "OTEL_TRACES_SAMPLER": "always_off"})
        assert sink.store.wait_for(lambda s: len(s) >= 1, 0.5) == []
