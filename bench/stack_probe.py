"""Reads a running stack's Prometheus counters around one request: the time split of its steps.

Per request (requests run one at a time, so the deltas are the request's own):
    steps, step_s       verifier engine steps and their time (splitspec_engine_step_seconds)
    round_trip_s        time the verifier waited for the method's drafts (round trip; an
                        in-target method: its drafting inside the step)
    proposer_s          time the proposer spent answering (splitspec_proposer_propose_seconds;
                        an in-target method: round_trip_s, it has no network)
    hits, misses        drafting-ahead outcomes (splitspec_spec_decode_ahead_total)
The split of a step: propose = proposer_s, network = round_trip_s - proposer_s (gRPC,
serialization, queueing), verify = step_s - round_trip_s (target forward, sampling, apply);
what the client waited beyond step_s is "other" (gateway, streaming, scheduling gaps).
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


class StackProbe:
    def __init__(self, stack):
        self.urls = stack.metrics_urls
        self.client = httpx.Client(timeout=10)

    def scrape(self, name: str) -> dict[tuple[str, tuple], float]:
        url = self.urls.get(name)
        if not url:
            return {}
        text = self.client.get(url).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def sample(self) -> dict[str, dict]:
        return {name: self.scrape(name) for name in self.urls if name != "gateway"}

    @staticmethod
    def delta(before: dict, after: dict, method: str) -> dict[str, float]:
        def get(svc: str, metric: str, **labels) -> float:
            key = (metric, tuple(sorted(labels.items())))
            return after.get(svc, {}).get(key, 0.0) - before.get(svc, {}).get(key, 0.0)

        out = {"steps": get("verifier", "splitspec_engine_step_seconds_count"),
               "step_s": get("verifier", "splitspec_engine_step_seconds_sum")}
        if method != "off":
            out["round_trip_s"] = get("verifier",
                                      "splitspec_spec_decode_proposer_round_trip_seconds_sum",
                                      method=method)
            out["proposer_s"] = (
                get(f"proposer-{method}", "splitspec_proposer_propose_seconds_sum", method=method)
                if f"proposer-{method}" in after
                else out["round_trip_s"])  # in-target: its drafting in the step, no network
            out["hits"] = get("verifier", "splitspec_spec_decode_ahead_total", method=method,
                              outcome="hit")
            out["misses"] = get("verifier", "splitspec_spec_decode_ahead_total",
                                method=method, outcome="miss")
            out["pushed"] = get("verifier", "splitspec_spec_decode_ahead_pushed_total",
                                method=method)
        return out
