"""What the REST and gRPC front doors share: the checks that need the served model (model name,
prompt size, token ids; each door checks the rest of a request at its own edge), the
speculation policy, picking a verifier, streaming its answer, and collecting a finished result;
metrics and the request's span, when the gateway has them, are fed here too.

Every decided generation counts as in flight here from its decision until its stream ends (or,
for one never streamed, RESERVATION_TTL_S). A replica's load, as the policy sees it, is these
(exact, at once: a burst is seen before any stats arrive) plus what its last stats snapshot
counted beyond this gateway's own streams (other gateways, direct clients). The policy's mode
and reason are written into the last message's usage.speculation.

Each request goes to the verifier with the policy's decision as its speculation_plan (the one
plan type, converted to protobuf here); the client's SpeculationConfig is not forwarded."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator

from gateway.chat import Chat
from gateway.policy import Load, SpeculationPolicy, base_method, plan_candidate
from gateway.verifier_pool import VerifierPool
from protos import common_pb2
from splitspec.errors import NotFound
from splitspec.goodput import CHARS_PER_TOKEN, prompt_class
from splitspec.params import (
    SamplingParams,
    SpeculationRequest,
    StoppingCriteria,
    check_prompt_chars,
    check_token_ids,
)
from splitspec.wire import FINISH_REASON_NAMES, plan_to_pb, sampling_to_pb, stopping_to_pb

if TYPE_CHECKING:
    from gateway.metrics import GatewayMetrics
    from gateway.tracing import GatewayTracer

RESERVATION_TTL_S = 60.0  # a decided generation that never streamed stops counting after this

@dataclass
class Collected:
    """A finished generation, assembled from its stream."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: common_pb2.Usage = field(default_factory=common_pb2.Usage)
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)

    def add(self, msg: common_pb2.GenerateResponse) -> None:
        self.text += msg.text
        self.token_ids.extend(msg.token_ids)
        self.logprobs.extend(msg.logprobs)
        if msg.finish_reason:
            self.finish_reason = FINISH_REASON_NAMES[msg.finish_reason]
            self.usage = msg.usage


class Frontend:
    def __init__(self, pool: VerifierPool, policy: SpeculationPolicy,
                 metrics: "GatewayMetrics | None" = None, tracer: "GatewayTracer | None" = None):
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        self.tracer = tracer
        # id -> (time, mode, reason, prompt class, greedy): the class's acceptance learns from
        # the request's usage when it finishes (Estimates.observe_request)
        self._decided: dict[str, tuple[float, str, str, str, bool]] = {}

    async def model_id(self) -> str:
        return (await self.pool.info()).model

    async def check_model(self, model: str | None) -> str:
        served = await self.model_id()
        if model and model != served:
            raise NotFound(f"model: {model!r} is not served here; served: {served!r}", "model")
        return served

    async def build_requests(self, request_ids: list[str], prompts: list[str | list[int] | Chat],
                             sampling: SamplingParams, stopping: StoppingCriteria,
                             speculation: SpeculationRequest, span=None,
                             samplings: list[SamplingParams] | None = None,
                             top_logprobs: int | None = None, cache_salt: str | None = None
                             ) -> list[common_pb2.GenerateRequest]:
        """REST: one GenerateRequest per prompt from the declared, validated dataclasses (converted
        to protobuf here, once), each with its own speculation decision; `samplings` (one per
        prompt) overrides `sampling`, e.g. for the n choices' own seeds."""
        samplings = samplings or [sampling] * len(prompts)
        return await self._build(request_ids, prompts,
                                 [(sampling_to_pb(p), p.greedy) for p in samplings],
                                 stopping_to_pb(stopping), speculation, span, top_logprobs,
                                 cache_salt)

    async def build_request(self, request_id: str, prompt: str | list[int] | Chat,
                            sampling: common_pb2.SamplingParams | None, greedy: bool,
                            stopping: common_pb2.StoppingCriteria | None,
                            speculation: SpeculationRequest, span=None,
                            top_logprobs: int | None = None, cache_salt: str | None = None
                            ) -> common_pb2.GenerateRequest:
        """gRPC: the client's own sampling and stopping messages (None: not set, the verifier's
        defaults), already checked by the caller, forwarded as they are."""
        (req,) = await self._build([request_id], [prompt], [(sampling, greedy)], stopping,
                                   speculation, span, top_logprobs, cache_salt)
        return req

    async def _build(self, request_ids: list[str], prompts: list[str | list[int] | Chat],
                     samplings: list[tuple[common_pb2.SamplingParams | None, bool]],
                     stopping: common_pb2.StoppingCriteria | None,
                     speculation: SpeculationRequest, span, top_logprobs: int | None,
                     cache_salt: str | None) -> list[common_pb2.GenerateRequest]:
        info = await self.pool.info()
        for prompt in prompts:  # what the verifier would refuse, refused before it is sent
            if isinstance(prompt, Chat):
                check_prompt_chars("messages", prompt.chars, info.max_model_len)
            elif isinstance(prompt, str):
                check_prompt_chars("prompt", len(prompt), info.max_model_len)
            else:
                check_token_ids("prompt", prompt)
        out = []
        for i, (request_id, prompt, (sampling, greedy)) in enumerate(
                zip(request_ids, prompts, samplings)):
            tokens = _prompt_tokens(prompt)
            decision = self.policy.decide(
                speculation, info, greedy, self.load(), tokens,
                structured=sampling is not None and sampling.HasField("structured"))
            # the candidate the usage is measured under (a shaped ngram: its own acceptance)
            self._decided[request_id] = (time.monotonic(), decision.mode.value, decision.reason,
                                         prompt_class(tokens), greedy,
                                         plan_candidate(decision.plan))
            plan = decision.plan
            if self.metrics is not None:
                self.metrics.on_decision(plan.method if plan.enabled else None, decision.reason)
            if i == 0 and span is not None and self.tracer is not None:
                self.tracer.on_plan(span, plan, decision.reason)
            req = common_pb2.GenerateRequest(request_id=request_id,
                                             speculation_plan=plan_to_pb(plan))
            if sampling is not None:
                req.sampling.CopyFrom(sampling)
            if stopping is not None:
                req.stopping.CopyFrom(stopping)
            if top_logprobs is not None:
                req.options.top_logprobs = top_logprobs
            if cache_salt is not None:
                req.cache_salt = cache_salt
            if isinstance(prompt, Chat):
                req.options.messages.extend(chat_messages_to_pb(prompt))
                req.options.tools.extend(prompt.tools)
            elif isinstance(prompt, str):
                req.text = prompt
            else:
                req.token_ids.ids.extend(prompt)
            out.append(req)
        return out

    def load(self) -> Load:
        """The least-loaded replica's running + waiting count: this gateway's generations in
        flight per replica plus the others its stats report."""
        now = time.monotonic()
        for rid in [r for r, (t, *_) in self._decided.items() if now - t > RESERVATION_TTL_S]:
            del self._decided[rid]
        est = self.policy.estimates
        replicas = [r.address for r in getattr(self.pool, "replicas", [])]
        known = [a for a in replicas if a in est.replicas]
        mine = math.ceil(len(self._decided) / max(len(replicas), 1))
        if not known:
            return Load(mine)
        address = min(known, key=est.others_load)
        return Load(mine + est.others_load(address), est.replicas[address].max_num_seqs,
                    address, est.recent_running.get(address, 0.0))

    async def stream(self, request: common_pb2.GenerateRequest
                     ) -> AsyncIterator[common_pb2.GenerateResponse]:
        source = (self.pool.generate(request) if self.metrics is None
                  else self._measured(request, self.metrics))
        decided = self._decided.get(request.request_id)
        try:
            async for msg in source:
                if msg.finish_reason and decided is not None:
                    spec = msg.usage.speculation
                    spec.mode, spec.policy_reason = decided[1:3]
                    if spec.method and spec.proposed_tokens:
                        # a shaped ngram (prompt lookup's range) is measured under its own
                        # name, overall too: the verifier's counts do not tell it apart
                        shaped = (decided[5] if decided[5] != spec.method
                                  and base_method(decided[5] or "") == spec.method else None)
                        self.policy.estimates.observe_request(
                            decided[3], shaped or spec.method, decided[4],
                            max(spec.num_branches, 1),
                            spec.accepted_tokens, spec.proposed_tokens, spec.steps,
                            spec.rejections, overall=shaped is not None)
                yield msg
        finally:
            self._decided.pop(request.request_id, None)

    async def _measured(self, request: common_pb2.GenerateRequest, metrics: "GatewayMetrics"
                        ) -> AsyncIterator[common_pb2.GenerateResponse]:
        start = time.perf_counter()
        waiting_first = True
        async for msg in self.pool.generate(request):
            if waiting_first and msg.token_ids:
                waiting_first = False
                metrics.on_first_token(time.perf_counter() - start)
            if msg.finish_reason:
                u = msg.usage
                metrics.on_finished(time.perf_counter() - start, u.prompt_tokens,
                                    u.completion_tokens, u.speculation.method or None)
            yield msg

    async def collect(self, request: common_pb2.GenerateRequest) -> Collected:
        out = Collected()
        async for msg in self.stream(request):
            out.add(msg)
        return out


def chat_messages_to_pb(chat: Chat) -> list[common_pb2.ChatMessage]:
    """A chat's turns as the wire's messages, with their tool fields."""
    out = [common_pb2.ChatMessage(role=r, content=c) for r, c in chat.turns]
    for msg, turn in zip(out, chat.tool_turns):
        msg.tool_calls.extend(common_pb2.ToolCall(id=i, name=n, arguments=a)
                              for i, n, a in turn.tool_calls)
        msg.tool_call_id, msg.name = turn.tool_call_id, turn.name
    return out


def _prompt_tokens(prompt) -> int:
    """The prompt's length in tokens: exact for token ids, estimated from characters for text
    (the verifier tokenizes it), for the policy's prompt class."""
    if isinstance(prompt, Chat):
        return prompt.chars // CHARS_PER_TOKEN
    if isinstance(prompt, str):
        return len(prompt) // CHARS_PER_TOKEN
    return len(prompt)
