"""gRPC edge of the verifier: protobuf <-> GenerationInput / StepOutput, thin handlers.

A request's speculation is the gateway's SpeculationPlan, converted once (`plan_from_pb`); a
request without one comes from a direct client and its SpeculationConfig is resolved here.

With tracing on, Generate starts the request's span under the incoming context (the gRPC
server span, whose parent came in the metadata); the engine's RequestTimeline completes it
(verifier_service/telemetry/tracing.py)."""

from __future__ import annotations

import asyncio
import uuid

from protos import common_pb2, verifier_pb2, verifier_pb2_grpc
from splitspec.params import (
    GenerationInput,
    LookaheadParams,
    SpeculationPlan,
    check_cache_salt,
    check_top_logprobs,
    resolve_speculation,
)
from splitspec.wire import (
    FINISH_REASON_FROM_NAME,
    lookahead_to_pb,
    plan_from_pb,
    sampling_from_pb,
    speculation_from_pb,
    stopping_from_pb,
)
from verifier_service.batching.sequence import StepOutput
from verifier_service.engine import Engine
from verifier_service.prompt import PromptEncoder
from verifier_service.telemetry.stats import AcceptanceCounts, EngineStats
from verifier_service.telemetry.tracing import VerifierTracer

IN_TARGET_ADDRESS = "in-target"  # ProposerStatus.address of a method the verifier runs itself


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(self, engine: Engine, model_name: str, fingerprint: str, device: str,
                 dtype: str, tracer: VerifierTracer | None = None,
                 chat_template: str | None = None):
        self._engine = engine
        self._model_name = model_name
        self._fingerprint = fingerprint
        self._device, self._dtype = device, dtype
        self._tracer = tracer
        self._prompts = PromptEncoder(engine.tokenizer, engine.max_model_len, chat_template)

    async def _from_pb(self, req: common_pb2.GenerateRequest) -> GenerationInput:
        top_logprobs = (req.options.top_logprobs if req.options.HasField("top_logprobs")
                        else None)
        check_top_logprobs("top_logprobs", top_logprobs)
        salt = req.cache_salt if req.HasField("cache_salt") else None
        check_cache_salt("cache_salt", salt)
        ids = await self._prompts.encode(req)
        plan = self._plan(req)
        return GenerationInput(
            # assigned here rather than by the engine: the span and the stream know it too
            request_id=req.request_id or uuid.uuid4().hex, prompt_token_ids=tuple(ids),
            sampling=sampling_from_pb(req.sampling, req.HasField("sampling")).validate(),
            stopping=stopping_from_pb(req.stopping, req.HasField("stopping")).validate(),
            speculation=plan, top_logprobs=top_logprobs,
            resumed_output_ids=tuple(req.resume.output_token_ids),
            resumed_text_chars=req.resume.sent_text_chars, cache_salt=salt)

    def _plan(self, req: common_pb2.GenerateRequest) -> SpeculationPlan:
        """The gateway's plan, taken as it is (Engine.add_request checks it against this
        verifier's limits); without one (a direct client), the client's SpeculationConfig
        resolved here without a policy: auto and on run the given or default k every step."""
        if req.HasField("speculation_plan"):
            return plan_from_pb(req.speculation_plan)
        return resolve_speculation(speculation_from_pb(req.speculation),
                                   self._engine.drafts.served_methods(),
                                   self._engine.config.default_num_speculative_tokens)

    async def Generate(self, request, context):
        inp = await self._from_pb(request)
        details = inp.speculation.details
        tracer = self._tracer
        if tracer is None:
            async for out in self._engine.generate(inp):
                yield self._to_pb(inp.request_id, out, details)
            return
        plan = inp.speculation
        traced = tracer.begin(inp.request_id, plan.method if plan.enabled else None,
                              plan.k if plan.enabled else 0)
        try:
            async for out in self._engine.generate(inp):
                yield self._to_pb(inp.request_id, out, details)
        except Exception as exc:
            tracer.fail(traced, exc)
            raise
        finally:
            tracer.settle(traced)

    def _to_pb(self, request_id: str, out: StepOutput,
               details: bool) -> common_pb2.GenerateResponse:
        msg = _output_to_pb(request_id, out, details)
        if out.logprobs is not None:
            decode = self._engine.tokenizer.decode
            for token_id, (logprob, top) in zip(out.token_ids, out.logprobs):
                entry = msg.logprobs.add(token_id=token_id, token=decode([token_id]),
                                         logprob=logprob)
                for t, lp in top:
                    entry.top.add(token_id=t, token=decode([t]), logprob=lp)
        return msg

    async def Abort(self, request, context):
        return verifier_pb2.AbortResponse(found=self._engine.abort(request.request_id))

    async def WatchStats(self, request, context):
        interval = (request.interval_ms or 1000) / 1000
        while True:
            yield _stats_to_pb(self._engine.snapshot())
            await asyncio.sleep(interval)

    async def Info(self, request, context):
        cfg = self._engine.config
        return verifier_pb2.VerifierInfo(
            model=self._model_name, vocab_size=self._engine.runner.vocab_size,
            tokenizer_fingerprint=self._fingerprint, max_model_len=self._engine.max_model_len,
            max_num_speculative_tokens=cfg.max_num_speculative_tokens,
            max_num_branches=cfg.max_num_branches,
            default_num_speculative_tokens=cfg.default_num_speculative_tokens,
            proposers=[verifier_pb2.ProposerStatus(method=m, address=c.address,
                                                   connected=c.connected)
                       for m, c in self._engine.proposers.items()]
            # in-target methods: served by this process, always there
            + [verifier_pb2.ProposerStatus(method=m, address=IN_TARGET_ADDRESS, connected=True)
               for m in self._engine.drafts.in_target.methods],
            device=self._device, dtype=self._dtype,
            lookahead_default=lookahead_to_pb(LookaheadParams(
                cfg.lookahead_window, cfg.lookahead_ngram, cfg.lookahead_guesses)))


def _stats_to_pb(s: EngineStats) -> verifier_pb2.EngineStats:
    return verifier_pb2.EngineStats(
        running=s.running, waiting=s.waiting, kv_blocks_total=s.kv_blocks_total,
        kv_blocks_free=s.kv_blocks_free, steps=s.steps, generated_tokens=s.generated_tokens,
        finished_requests=s.finished_requests, aborted_requests=s.aborted_requests,
        preemptions=s.preemptions, step_seconds_total=s.step_seconds_total,
        max_num_seqs=s.max_num_seqs,
        methods=[verifier_pb2.MethodStats(method=m, proposed_tokens=v.proposed_tokens,
                                          accepted_tokens=v.accepted_tokens, steps=v.steps,
                                          missed_steps=v.missed_steps,
                                          unavailable=v.unavailable,
                                          greedy=_acceptance_to_pb(v.greedy),
                                          sampled=_acceptance_to_pb(v.sampled),
                                          round_trips=[
                                              verifier_pb2.RoundTripBucket(
                                                  k=k, calls=n, seconds_total=sec)
                                              for k, (n, sec) in sorted(v.round_trips.items())],
                                          round_trips_by_seqs=[
                                              verifier_pb2.RoundTripBucket(
                                                  k=k, calls=n, seconds_total=sec, max_seqs=c)
                                              for (k, c), (n, sec)
                                              in sorted(v.round_trips_by_seqs.items())],
                                          longest_draft=len(v.accepted_per_position),
                                          ahead_hits=v.ahead_hits,
                                          ahead_misses=v.ahead_misses,
                                          ahead_pushed=v.ahead_pushed,
                                          trees=[verifier_pb2.TreeCounts(
                                              branches=b, greedy=_acceptance_to_pb(t.greedy),
                                              sampled=_acceptance_to_pb(t.sampled))
                                              for b, t in sorted(v.trees.items())])
                 for m, v in sorted(s.per_method.items())],
        step_cost=[_step_cost_to_pb(b) for b in s.step_cost if b.steps],
        step_cost_by_seqs=[_step_cost_to_pb(b) for _, b in sorted(s.step_cost_by_seqs.items())],
        step_cost_by_method=[_step_cost_to_pb(b)
                             for _, b in sorted(s.step_cost_by_method.items())])


def _step_cost_to_pb(b) -> verifier_pb2.StepCostBucket:
    return verifier_pb2.StepCostBucket(max_tokens=b.max_tokens, steps=b.steps,
                                       tokens_total=b.tokens_total,
                                       seconds_total=b.seconds_total, kind=b.kind,
                                       max_seqs=b.max_seqs, method=b.method)


def _acceptance_to_pb(c: AcceptanceCounts) -> verifier_pb2.AcceptanceCounts:
    return verifier_pb2.AcceptanceCounts(drafts=c.drafts, proposed_tokens=c.proposed_tokens,
                                         accepted_tokens=c.accepted_tokens,
                                         rejections=c.rejections, asked=c.asked,
                                         asked_at=c.asked_at, drafted_at=c.drafted_at,
                                         accepted_at=c.accepted_at)


def _output_to_pb(request_id: str, out: StepOutput,
                  details: bool = False) -> common_pb2.GenerateResponse:
    msg = common_pb2.GenerateResponse(request_id=request_id, token_ids=out.token_ids,
                                      text=out.text)
    if out.finish_reason is not None:
        msg.finish_reason = FINISH_REASON_FROM_NAME[out.finish_reason]
    if out.usage is not None:
        u = out.usage
        msg.usage.prompt_tokens = u.prompt_tokens
        msg.usage.completion_tokens = u.completion_tokens
        msg.usage.cached_tokens = u.cached_tokens
        spec = msg.usage.speculation
        spec.method = u.method or ""
        spec.num_speculative_tokens = u.num_speculative_tokens
        spec.proposed_tokens = u.proposed_tokens
        spec.accepted_tokens = u.accepted_tokens
        spec.steps = u.steps
        spec.rejections = u.rejections
        spec.reason = u.reason
        spec.branch_hits = u.branch_hits
        spec.num_branches = u.num_branches if u.num_branches > 1 else 0
        if details:
            spec.accepted_per_position.extend(u.accepted_per_position)
            spec.step_draft_tokens.extend(d for d, _ in u.step_counts)
            spec.step_accepted_tokens.extend(a for _, a in u.step_counts)
    return msg
