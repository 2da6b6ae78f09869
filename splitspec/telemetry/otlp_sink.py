"""A small OTLP trace receiver: keeps the spans it is sent, and prints them as trees.

Built from opentelemetry-proto's collector service: a gRPC server implementing
opentelemetry.proto.collector.trace.v1.TraceService (OTLP/gRPC) and, optionally, an HTTP
endpoint taking POST /v1/traces (OTLP/HTTP, protobuf). The tests and the observability
benchmark export to it; on its own it shows a trace without a tracing backend:

    python -m splitspec.telemetry.otlp_sink --port 4317 --http-port 4318
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 make run    # in another terminal

Each trace is printed as an indented tree once no span of it has arrived for a second.
"""

from __future__ import annotations

import argparse
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER",
          5: "CONSUMER"}


def _value(v) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which) if which else None


def _attrs(kvs) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Event:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass
class Span:
    service: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace id, span id)
    status_code: int = 0  # 0 unset, 1 ok, 2 error

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def spans_from_request(req: trace_service_pb2.ExportTraceServiceRequest) -> list[Span]:
    out = []
    for rs in req.resource_spans:
        service = str(_attrs(rs.resource.attributes).get("service.name", ""))
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(Span(
                    service, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name,
                    _KINDS.get(s.kind, str(s.kind)), s.start_time_unix_nano,
                    s.end_time_unix_nano, _attrs(s.attributes),
                    [Event(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in s.events],
                    [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                    s.status.code))
    return out


class SpanStore:
    """The spans received so far; safe to read from any thread."""

    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._cond = threading.Condition()
        self.requests = 0

    def add(self, spans: list[Span]) -> None:
        with self._cond:
            self._spans.extend(spans)
            self.requests += 1
            self._cond.notify_all()

    def spans(self) -> list[Span]:
        with self._cond:
            return list(self._spans)

    def clear(self) -> None:
        with self._cond:
            self._spans.clear()

    def wait_for(self, predicate: Callable[[list[Span]], bool], timeout: float) -> list[Span]:
        """Wait until predicate(spans) holds; returns the spans either way."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self._spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return list(self._spans)

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.spans() if s.trace_id == trace_id]


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, store: SpanStore):
        self._store = store

    def Export(self, request, context):
        self._store.add(spans_from_request(request))
        return trace_service_pb2.ExportTraceServiceResponse()


def _http_handler(store: SpanStore):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            if self.path.rstrip("/") != "/v1/traces":
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            req = trace_service_pb2.ExportTraceServiceRequest()
            req.ParseFromString(body)
            store.add(spans_from_request(req))
            payload = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):  # quiet
            pass

    return Handler


class OtlpSink:
    """OTLP/gRPC on `port` (0: a free one) and, if `http_port` is not None, OTLP/HTTP."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, http_port: int | None = None):
        self.store = SpanStore()
        self._server = grpc.server(futures.ThreadPoolExecutor(4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self.store),
                                                                  self._server)
        self.host = host
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        self._http: ThreadingHTTPServer | None = None
        if http_port is not None:
            self._http = ThreadingHTTPServer((host, http_port), _http_handler(self.store))
            self.http_port = self._http.server_address[1]

    @property
    def endpoint(self) -> str:
        """For OTEL_EXPORTER_OTLP_ENDPOINT with the grpc protocol."""
        return f"http://{self.host}:{self.port}"

    @property
    def http_endpoint(self) -> str:
        """For OTEL_EXPORTER_OTLP_ENDPOINT with http/protobuf (the exporter adds /v1/traces)."""
        return f"http://{self.host}:{self.http_port}"

    def start(self) -> "OtlpSink":
        self._server.start()
        if self._http is not None:
            threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    def __enter__(self) -> "OtlpSink":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def format_trace(spans: list[Span]) -> str:
    """One trace as an indented tree: service, span name, duration, then attributes/events."""
    by_id = {s.span_id: s for s in spans}
    children: dict[str, list[Span]] = {}
    for s in spans:
        parent = s.parent_span_id if s.parent_span_id in by_id else ""
        children.setdefault(parent, []).append(s)
    t0 = min((s.start_ns for s in spans), default=0)
    lines: list[str] = []

    def show(s: Span, depth: int) -> None:
        pad = "  " * depth
        lines.append(f"{pad}{s.service} | {s.name} | +{(s.start_ns - t0) / 1e6:.1f} ms, "
                     f"{s.duration_s * 1e3:.1f} ms")
        for k, v in sorted(s.attributes.items()):
            if k.startswith(("gen_ai.", "splitspec.")):
                lines.append(f"{pad}    {k} = {v}")
        for e in s.events[:8]:
            lines.append(f"{pad}    @+{(e.time_ns - t0) / 1e6:.1f} ms {e.name} {e.attributes}")
        if len(s.events) > 8:
            lines.append(f"{pad}    ... {len(s.events) - 8} more events")
        for c in sorted(children.get(s.span_id, []), key=lambda c: c.start_ns):
            show(c, depth + 1)

    for root in sorted(children.get("", []), key=lambda s: s.start_ns):
        show(root, 0)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=4317, help="OTLP/gRPC port")
    ap.add_argument("--http-port", type=int, default=4318, help="OTLP/HTTP port (-1: off)")
    args = ap.parse_args()
    sink = OtlpSink(args.host, args.port, None if args.http_port < 0 else args.http_port)
    sink.start()
    print(f"OTLP sink: grpc {sink.endpoint}"
          + (f", http {sink.http_endpoint}" if args.http_port >= 0 else ""), flush=True)
    shown: set[str] = set()
    counts: dict[str, tuple[int, float]] = {}  # trace id -> (spans seen, since when)
    try:
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            current: dict[str, int] = {}
            for s in sink.store.spans():
                current[s.trace_id] = current.get(s.trace_id, 0) + 1
            for tid, n in current.items():
                if tid in shown:
                    continue
                seen, since = counts.get(tid, (-1, now))
                if seen != n:
                    counts[tid] = (n, now)
                elif now - since >= 1.0:  # nothing new for a second: print it
                    shown.add(tid)
                    print(f"\ntrace {tid}\n{format_trace(sink.store.trace(tid))}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        sink.stop()


if __name__ == "__main__":
    main()
