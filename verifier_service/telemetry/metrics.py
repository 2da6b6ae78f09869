"""The verifier's Prometheus exporter: an EngineObserver that turns StepStats and
RequestTimelines into counters and histograms, plus gauges read from Engine.snapshot() when
Prometheus scrapes.

The speculation counters mirror vLLM's (`vllm:spec_decode_*`) under the `splitspec_` prefix, so a
vLLM dashboard ports by changing the prefix. Everything is a counter or a histogram; rates are
left to PromQL:

    acceptance rate, per method:
      sum by (method) (rate(splitspec_spec_decode_num_accepted_tokens_total[5m]))
        / sum by (method) (rate(splitspec_spec_decode_num_proposed_tokens_total[5m]))
    mean accepted length (draft tokens accepted per draft; tokens per step = this + 1):
      sum by (method) (rate(splitspec_spec_decode_num_accepted_tokens_total[5m]))
        / sum by (method) (rate(splitspec_spec_decode_num_drafts_total[5m]))
    acceptance at draft position p (of drafts that had a position p):
      sum by (method, position) (rate(splitspec_spec_decode_num_accepted_tokens_per_pos_total[5m]))
        / on (method) group_left sum by (method) (rate(splitspec_spec_decode_num_drafts_total[5m]))

    structured outputs: grammar compile-cache hit rate, and forced drafts accepted:
      rate(splitspec_structured_output_grammar_cache_hits_total[5m])
        / (rate(splitspec_structured_output_grammar_cache_hits_total[5m])
           + rate(splitspec_structured_output_grammar_compiles_total[5m]))
      rate(splitspec_in_target_forced_tokens_accepted_total{method="grammar"}[5m])
        / rate(splitspec_in_target_forced_tokens_total{method="grammar"}[5m])

    prefix-cache hit rate (of prompt tokens):
      rate(splitspec_prefix_cache_hits_total[5m]) / rate(splitspec_prefix_cache_queries_total[5m])

Cost per engine step: a few integer additions per method and one histogram observation per
method asked plus one for the step; no allocation once a method's counters exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry

from splitspec.telemetry.metrics import (
    LATENCY_BUCKETS,
    STEP_BUCKETS,
    counter,
    gauge,
    histogram,
    with_old_name,
)
from verifier_service.telemetry.stats import EngineStats, RequestTimeline, StepStats

# Reasons a proposer's help was lost for a step, as counted in
# splitspec_spec_decode_proposer_misses_total{reason}: "late" (no usable answer before the
# per-step deadline, or the proposer was unreachable), "garbage" (an answer that failed
# validation), "resync" (the proposer lost the sequence's state and asked for its history).
MISS_REASONS = ("late", "garbage", "resync")


@dataclass
class _MethodCounters:
    drafts: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    steps: int = 0  # steps in which the method was asked
    misses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MISS_REASONS, 0))
    round_trip: object = None  # the method's bound histogram child
    ahead: dict[str, int] = field(default_factory=lambda: {"hit": 0, "miss": 0})
    pushed: int = 0
    branch_hits: int = 0


class VerifierMetrics:
    """EngineObserver and prometheus collector. `snapshot` (usually Engine.snapshot) supplies
    the gauges at scrape time; bind it later with `bind` when the engine is built after this."""

    def __init__(self, registry: CollectorRegistry,
                 snapshot: Callable[[], EngineStats] | None = None):
        self._snapshot = snapshot
        self._methods: dict[str, _MethodCounters] = {}
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.finished: dict[str, int] = {}  # finished_reason -> requests
        self.failed = 0  # requests ended by a failed step
        self.generation_tokens_by_method: dict[str, int] = {}  # method ("none": off) -> tokens
        self._step_seconds = histogram(
            registry, "splitspec_engine_step_seconds", "Verifier engine step time (one target "
            "forward and rejection sampling for the whole batch, proposer wait included)",
            STEP_BUCKETS)
        self._round_trip = histogram(
            registry, "splitspec_spec_decode_proposer_round_trip_seconds",
            "Time from sending a step's message to a proposer to its answer", STEP_BUCKETS,
            ["method"])
        arrival = "Time from a request's arrival at the verifier"
        self._ttft = histogram(registry, "splitspec_time_to_first_token_seconds",
                               f"{arrival} to its first output token", LATENCY_BUCKETS)
        self._tpot = histogram(registry, "splitspec_time_per_output_token_seconds",
                               "Mean time per output token after the first, per request",
                               STEP_BUCKETS)
        self._e2e = histogram(registry, "splitspec_e2e_request_latency_seconds",
                              f"{arrival} to its last token", LATENCY_BUCKETS)
        self._queue = histogram(registry, "splitspec_request_queue_time_seconds",
                                "Time a request waited before it was first scheduled",
                                LATENCY_BUCKETS)
        registry.register(self)

    def bind(self, snapshot: Callable[[], EngineStats]) -> None:
        self._snapshot = snapshot

    def _method(self, name: str) -> _MethodCounters:
        c = self._methods.get(name)
        if c is None:
            c = self._methods[name] = _MethodCounters(round_trip=self._round_trip.labels(name))
        return c

    # -- EngineObserver ------------------------------------------------------------------------

    def on_step(self, step: StepStats) -> None:
        self.generation_tokens += step.emitted_tokens
        self._step_seconds.observe(step.seconds)
        for name, ms in step.per_method.items():
            c = self._methods.get(name) or self._method(name)
            c.steps += 1
            if ms.drafts:
                # Drafted before accepted: a concurrent scrape never sees accepted > drafted.
                c.drafts += ms.drafts
                c.proposed_tokens += ms.proposed_tokens
                per_pos = c.accepted_per_position
                if len(per_pos) < len(ms.accepted_per_position):
                    per_pos.extend([0] * (len(ms.accepted_per_position) - len(per_pos)))
                for j, n in enumerate(ms.accepted_per_position):
                    per_pos[j] += n
                c.accepted_tokens += ms.accepted_tokens
                c.branch_hits += getattr(ms, "branch_hits", 0)
            if ms.round_trip_s is not None:
                c.round_trip.observe(ms.round_trip_s)
            if ms.missed:
                c.misses["late"] += 1
            # Counted by the engine where it tells them apart (optional fields).
            garbage = getattr(ms, "garbage", 0)
            if garbage:
                c.misses["garbage"] += garbage
            resyncs = getattr(ms, "resyncs", 0)
            if resyncs:
                c.misses["resync"] += resyncs
            c.ahead["hit"] += ms.ahead_hits
            c.ahead["miss"] += ms.ahead_misses
            c.pushed += ms.ahead_pushed

    def on_request_done(self, tl: RequestTimeline) -> None:
        reason = tl.finish_reason or "abort"
        if reason == "error":
            self.failed += 1
        else:
            self.finished[reason] = self.finished.get(reason, 0) + 1
        self.prompt_tokens += tl.prompt_tokens
        method = tl.method or "none"
        self.generation_tokens_by_method[method] = (
            self.generation_tokens_by_method.get(method, 0) + tl.completion_tokens)
        end = tl.finished
        if end is None:
            return
        self._e2e.observe(max(end - tl.arrival, 0.0))
        if tl.admitted is not None:
            self._queue.observe(max(tl.admitted - tl.arrival, 0.0))
        if tl.first_token is not None:
            self._ttft.observe(max(tl.first_token - tl.arrival, 0.0))
            if tl.completion_tokens > 1:
                self._tpot.observe(max(end - tl.first_token, 0.0) / (tl.completion_tokens - 1))

    # -- prometheus collector ------------------------------------------------------------------

    def describe(self) -> list:
        return []  # families are produced at collect time; nothing to check at registration

    def collect(self) -> Iterator:
        methods = list(self._methods.items())
        # Read accepted before drafted (the reverse of on_step's order): accepted <= drafted.
        accepted = [((m,), c.accepted_tokens) for m, c in methods]
        per_pos = [((m, str(j)), n) for m, c in methods
                   for j, n in enumerate(list(c.accepted_per_position))]
        yield counter("splitspec_spec_decode_num_accepted_tokens",
                      "Draft tokens accepted by the rejection sampler", ["method"], accepted)
        yield counter("splitspec_spec_decode_num_accepted_tokens_per_pos",
                      "Drafts whose token at draft position `position` (0-based) was accepted",
                      ["method", "position"], per_pos)
        yield from with_old_name(counter(
            "splitspec_spec_decode_num_proposed_tokens", "Draft tokens proposed and verified",
            ["method"], [((m,), c.proposed_tokens) for m, c in methods]),
            "splitspec_spec_decode_num_draft_tokens")
        yield counter("splitspec_spec_decode_branch_hits",
                      "Token trees: drafts whose accepted path took a lower-ranked sibling "
                      "somewhere (a chain never does)", ["method"],
                      [((m,), c.branch_hits) for m, c in methods])
        yield counter("splitspec_spec_decode_num_drafts",
                      "Sequence-steps that verified a non-empty draft", ["method"],
                      [((m,), c.drafts) for m, c in methods])
        yield counter("splitspec_spec_decode_proposer_steps",
                      "Steps in which a proposer method was asked for drafts", ["method"],
                      [((m,), c.steps) for m, c in methods])
        yield counter("splitspec_spec_decode_proposer_misses",
                      "Steps or sequences that lost speculation to the proposer, by reason "
                      "(late, garbage, resync)", ["method", "reason"],
                      [((m, r), n) for m, c in methods for r, n in c.misses.items()])
        yield from with_old_name(counter(
            "splitspec_spec_decode_ahead",
            "Drafts by drafting-ahead outcome: hit (answered from the proposer's drafting ahead) "
            "or miss (drafted ahead for other outcomes, drafted afresh); hit rate: "
            "sum(rate(..{outcome=\"hit\"})) / sum(rate(..))", ["method", "outcome"],
            [((m, o), n) for m, c in methods for o, n in c.ahead.items()]),
            "splitspec_spec_decode_precompute")
        yield from with_old_name(counter(
            "splitspec_spec_decode_ahead_pushed",
            "Of the drafting-ahead hits, those taken from what the proposer pushed as soon as it "
            "had drafted ahead (no round trip waited for)", ["method"],
            [((m,), c.pushed) for m, c in methods]),
            "splitspec_spec_decode_precompute_pushed")
        yield counter("splitspec_generation_tokens", "Output tokens emitted by the engine",
                      samples=[((), self.generation_tokens)])
        yield counter("splitspec_prompt_tokens", "Prompt tokens of finished requests",
                      samples=[((), self.prompt_tokens)])
        yield counter("splitspec_request_generation_tokens",
                      "Output tokens of finished requests, by speculation method (none: off)",
                      ["method"], [((m,), n) for m, n in
                                   list(self.generation_tokens_by_method.items())])
        yield counter("splitspec_request_success",
                      "Finished requests by finish reason (stop, length, abort)",
                      ["finished_reason"], [((r,), n) for r, n in list(self.finished.items())])
        yield counter("splitspec_request_failures",
                      "Requests ended by an error in their engine step",
                      samples=[((), self.failed)])
        if self._snapshot is None:
            return
        s = self._snapshot()
        yield counter("splitspec_num_preemptions", "Sequences preempted to free KV blocks",
                      samples=[((), s.preemptions)])
        yield gauge("splitspec_num_requests_running", "Requests in the running batch", s.running)
        yield gauge("splitspec_num_requests_waiting", "Requests waiting to be scheduled",
                    s.waiting)
        yield gauge("splitspec_kv_cache_blocks_total", "KV cache blocks", s.kv_blocks_total)
        yield gauge("splitspec_kv_cache_blocks_used", "KV cache blocks in use",
                    s.kv_blocks_total - s.kv_blocks_free)
        yield gauge("splitspec_kv_cache_usage_perc", "KV cache usage (0 to 1)",
                    (s.kv_blocks_total - s.kv_blocks_free) / s.kv_blocks_total
                    if s.kv_blocks_total else 0.0)
        yield counter("splitspec_prefix_cache_queries", "Prompt tokens looked up in the prefix "
                      "cache, at each admission (vLLM's prefix_cache_queries)",
                      samples=[((), s.prefix_cache_queries)])
        yield counter("splitspec_prefix_cache_hits", "Of the prompt tokens looked up, those "
                      "whose KV was found cached (vLLM's prefix_cache_hits)",
                      samples=[((), s.prefix_cache_hits)])
        yield counter("splitspec_prefix_cache_evictions", "Cached KV blocks whose contents an "
                      "allocation took", samples=[((), s.prefix_cache_evictions)])
        yield gauge("splitspec_prefix_cache_blocks", "KV cache blocks the prefix cache names "
                    "(held by requests or free to reuse)", s.prefix_cache_blocks)
        yield counter("splitspec_structured_output_pruned_draft_tokens", "Draft tokens pruned "
                      "before their step because the request's grammar forbids them (rejected "
                      "for certain; no row spent)", samples=[((), s.grammar_pruned_tokens)])
        yield counter("splitspec_structured_output_requests", "Structured requests admitted, "
                      "by kind (json_object, json_schema, regex, choice, grammar)", ["kind"],
                      [((k,), n) for k, n in list(s.structured_requests.items())])
        yield counter("splitspec_structured_output_grammar_compiles", "Structured outputs' "
                      "grammars compiled (compile-cache misses)",
                      samples=[((), s.grammar_compiles)])
        yield counter("splitspec_structured_output_grammar_compile_seconds", "Time those "
                      "compilations took; mean: rate(.._seconds_total) / rate(.._compiles_total)",
                      samples=[((), s.grammar_compile_seconds)])
        yield counter("splitspec_structured_output_grammar_cache_hits", "Structured requests "
                      "whose grammar was found compiled (or compiling) in the compile cache",
                      samples=[((), s.grammar_cache_hits)])
        yield from _in_target_families(s.in_target)
        if s.executor is not None:
            yield from _executor_families(s.executor)


def _executor_families(x) -> Iterator:
    """How the step executor ran steps (verifier_service/step/executor.py ExecutorStats)."""
    steps = [(("captured", ""), x.captured_steps)]
    steps += [(("eager", reason or "no_graphs"), n) for reason, n in list(x.eager_steps.items())]
    tokens = [(("captured", ""), x.captured_tokens)]
    tokens += [(("eager", reason or "no_graphs"), n)
               for reason, n in list(x.eager_tokens.items())]
    yield counter("splitspec_step_executor_steps", "Engine steps by how they ran: a replayed "
                  "graph (captured) or eagerly, with the reason on a device that captures "
                  "(prefill, no_bucket, not_captured, model_without_lean_forward; no_graphs: "
                  "the device has none)", ["mode", "reason"], steps)
    yield counter("splitspec_step_executor_tokens", "Fed rows (padding excluded) of engine "
                  "steps by how they ran", ["mode", "reason"], tokens)
    yield counter("splitspec_step_executor_sampler_steps", "Steps with nothing to verify and "
                  "a sampled row, sampled by the step sampler: its graph replayed (captured) "
                  "or its body run eagerly", ["mode"],
                  [((mode,), n) for mode, n in list(x.sampler_steps.items())])
    yield counter("splitspec_step_executor_bucket_steps", "Engine steps run at a bucket's "
                  "padded shape (captured or not)", samples=[((), x.bucket_steps)])
    yield gauge("splitspec_step_executor_graphs", "Step graphs captured at start-up",
                x.graphs)
    yield gauge("splitspec_step_executor_graph_memory_bytes", "Device memory the captured "
                "graphs hold, beside the KV cache", x.graph_pool_bytes)
    yield gauge("splitspec_step_executor_capture_seconds", "Time spent capturing the step "
                "graphs at start-up", x.capture_seconds)


def _in_target_families(stats: dict[str, dict[str, float]]) -> Iterator:
    """`splitspec_in_target_<name>{method}` per in-target method's stat: a counter for names
    ending in `_total`, else a gauge (verifier_service/methods/in_target.py,
    InTargetMethod.stats)."""
    names = sorted({n for per in stats.values() for n in per})
    for name in names:
        samples = [((m,), per[name]) for m, per in stats.items() if name in per]
        doc = f"In-target method statistic {name} (see docs/observability.md)"
        if name.endswith("_total"):
            yield counter(f"splitspec_in_target_{name[:-len('_total')]}", doc, ["method"],
                          samples)
        else:
            yield gauge(f"splitspec_in_target_{name}", doc, labels=["method"], samples=samples)
