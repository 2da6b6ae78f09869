"""The gateway's Prometheus exporter: requests per API and status, the speculation policy's
decisions by reason, verifier replicas chosen by reason, tokens as clients received them, and
client-side latencies.

Share of output tokens generated with speculation on:
    sum(rate(splitspec_gateway_generation_tokens_total{method!="none"}[5m]))
      / sum(rate(splitspec_gateway_generation_tokens_total[5m]))
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry

from splitspec.telemetry.metrics import LATENCY_BUCKETS, counter, gauge, histogram


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry,
                 in_flight: Callable[[], dict[str, int]] | None = None,
                 resumed_streams: Callable[[], int] | None = None,
                 routing_decisions: Callable[[], dict[str, int]] | None = None):
        self.requests: dict[tuple[str, str], int] = {}  # (api, code) -> requests
        self.decisions: dict[tuple[str, str, str], int] = {}  # (decision, reason, method)
        self.generation_tokens: dict[str, int] = {}  # method ("none": off) -> tokens
        self.prompt_tokens = 0
        self._in_flight = in_flight
        self._resumed_streams = resumed_streams
        self._routing_decisions = routing_decisions
        sent = "Time from the gateway sending a request to a verifier"
        self._ttft = histogram(registry, "splitspec_gateway_time_to_first_token_seconds",
                               f"{sent} to its first token", LATENCY_BUCKETS)
        self._e2e = histogram(registry, "splitspec_gateway_e2e_request_latency_seconds",
                              f"{sent} to its last token", LATENCY_BUCKETS)
        registry.register(self)

    def on_request(self, api: str, code: str) -> None:
        """One API request answered (REST: the HTTP status; gRPC: the status code name)."""
        key = (api, code)
        self.requests[key] = self.requests.get(key, 0) + 1

    def on_decision(self, method: str | None, reason: str) -> None:
        key = ("on" if method else "off", reason, method or "none")
        self.decisions[key] = self.decisions.get(key, 0) + 1

    def on_first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def on_finished(self, seconds: float, prompt_tokens: int, completion_tokens: int,
                    method: str | None) -> None:
        self._e2e.observe(seconds)
        self.prompt_tokens += prompt_tokens
        m = method or "none"
        self.generation_tokens[m] = self.generation_tokens.get(m, 0) + completion_tokens

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        yield counter("splitspec_gateway_requests",
                      "API requests answered, by API (rest, grpc) and status code",
                      ["api", "code"], list(self.requests.items()))
        yield counter("splitspec_policy_decisions",
                      "Speculation decisions per generation, by outcome, reason and method",
                      ["decision", "reason", "method"], list(self.decisions.items()))
        yield counter("splitspec_gateway_generation_tokens",
                      "Output tokens delivered, by speculation method (none: off)", ["method"],
                      [((m,), n) for m, n in list(self.generation_tokens.items())])
        yield counter("splitspec_gateway_prompt_tokens", "Prompt tokens of finished generations",
                      samples=[((), self.prompt_tokens)])
        if self._resumed_streams is not None:
            yield counter("splitspec_gateway_stream_resumes",
                          "Generations continued on another verifier replica after theirs went "
                          "away mid-stream", samples=[((), self._resumed_streams())])
        if self._routing_decisions is not None:
            yield counter("splitspec_gateway_routing_decisions",
                          "Verifier replicas chosen for generations, by reason: prefix_hit (the "
                          "replica recently sent its longest prefix), least_load (no prefix "
                          "match: the least requests in flight), load_imbalance (a match on a "
                          "replica too busy beside the others), fallback (its replica was gone, "
                          "draining or failed it)", ["reason"],
                          [((r,), n) for r, n in list(self._routing_decisions().items())])
        if self._in_flight is not None:
            yield gauge("splitspec_gateway_verifier_requests_in_flight",
                        "Generations in flight per verifier replica", labels=["verifier"],
                        samples=[((a,), n) for a, n in self._in_flight().items()])
