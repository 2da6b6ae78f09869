"""The bodies of the REST generation endpoints: how /v1/completions and /v1/chat/completions
parse a request and shape their responses, stream chunks and logprobs (GenerationApi), and the
usage of a request's generations summed into one (request_usage)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.chat import (
    chat_body,
    chat_choice,
    chat_chunk,
    chat_delta,
    chat_logprobs,
    new_chat_id,
)
from gateway.frontend import Collected
from gateway.openai_api import (
    Generation,
    SpeculationDetails,
    choice_body,
    completion_body,
    completion_logprobs,
    new_completion_id,
    usage_body,
)
from gateway.request_models import parse_chat_request, parse_completion_request
from gateway.tool_parsers import ToolCallParser
from gateway.tool_parsers.events import Content, delta_tool_calls
from protos import common_pb2
from splitspec.errors import InvalidArgument, ServiceError


def request_usage(usages: list[common_pb2.Usage], details: bool = False, n: int = 1) -> dict:
    """One usage for a request's generations; its n choices of a prompt count the prompt (and
    its cached tokens) once."""
    methods = {u.speculation.method for u in usages if u.speculation.method}
    reasons = {u.speculation.reason for u in usages if u.speculation.reason}
    modes = {u.speculation.mode for u in usages if u.speculation.mode}
    policy = {u.speculation.policy_reason for u in usages if u.speculation.policy_reason}
    detail = None
    if details:  # prompts of one request: positions summed, steps in prompt order
        per_pos: list[int] = []
        steps: list[tuple[int, int]] = []
        for u in usages:
            s = u.speculation
            per_pos.extend([0] * (len(s.accepted_per_position) - len(per_pos)))
            for j, k in enumerate(s.accepted_per_position):
                per_pos[j] += k
            steps.extend(zip(s.step_draft_tokens, s.step_accepted_tokens))
        detail = SpeculationDetails(per_pos, steps)
    return usage_body(
        sum(u.prompt_tokens for u in usages) // n, sum(u.completion_tokens for u in usages),
        methods.pop() if len(methods) == 1 else None,
        max((u.speculation.num_speculative_tokens for u in usages), default=0),
        sum(u.speculation.proposed_tokens for u in usages),
        sum(u.speculation.accepted_tokens for u in usages),
        sum(u.speculation.steps for u in usages), detail, ",".join(sorted(reasons)),
        mode=",".join(sorted(modes)), policy_reason=",".join(sorted(policy)),
        branch_hits=sum(u.speculation.branch_hits for u in usages),
        num_branches=max((u.speculation.num_branches for u in usages), default=0),
        cached_tokens=sum(u.cached_tokens for u in usages) // n)


class ToolStreams:
    """A streamed chat request's tool-call readers, one per choice: each chunk's text becomes
    content and `delta.tool_calls` fragments; a choice that called a tool and stopped finishes
    with "tool_calls"."""

    def __init__(self, readers: list[ToolCallParser | None]):
        self.readers = readers
        self.called = [False] * len(readers)

    def delta(self, index: int, text: str, reason: str | None, logprobs: dict | None
              ) -> dict | None:
        reader = self.readers[index]
        if reader is None:
            return chat_delta(index, text, reason, logprobs)
        events = reader.feed(text) + (reader.finish() if reason else [])
        content = "".join(e.text for e in events if isinstance(e, Content))
        calls = delta_tool_calls(events)
        self.called[index] = self.called[index] or bool(calls)
        if reason == "stop" and self.called[index]:
            reason = "tool_calls"
        if not (content or calls or reason or logprobs):
            return None  # held back (it may start a tool call)
        return chat_delta(index, content, reason, logprobs, tool_calls=calls)


@dataclass
class GenerationApi:
    """One of the generation endpoints: how its body parses and its responses look.
    `tool_parser`: the format auto tool choice reads (--tool-call-parser) when the gateway
    serves it (--enable-auto-tool-choice); None: tool_choice "auto" is refused."""

    chat: bool
    tool_parser: str | None = None

    def parse(self, body, max_prompts: int) -> tuple[list, Generation]:
        if self.chat:
            req = parse_chat_request(body)
            tools = req.generation.tools
            if tools is not None and tools.choice == "auto" and self.tool_parser is None:
                raise InvalidArgument(
                    "tool_choice", '"auto" (the default with tools) needs a gateway started '
                    'with --enable-auto-tool-choice; "none", "required" or a named function '
                    "need nothing")
            return [req.chat], req.generation
        req = parse_completion_request(body, max_prompts)
        return req.prompts, req.generation

    def new_id(self) -> str:
        return new_chat_id() if self.chat else new_completion_id()

    def logprobs(self, gen: Generation, entries, offset: int = 0) -> dict | None:
        if gen.top_logprobs is None:
            return None
        return chat_logprobs(entries) if self.chat else completion_logprobs(entries, offset)

    def body(self, cid: str, model: str, gen: Generation, results: list[Collected],
             usage: dict) -> dict:
        if self.chat:
            return chat_body(cid, model, [self._chat_choice(gen, i, r)
                                          for i, r in enumerate(results)], usage)
        return completion_body(cid, model, [choice_body(i, r.text, r.finish_reason,
                                                        self.logprobs(gen, r.logprobs))
                                            for i, r in enumerate(results)], usage)

    def _chat_choice(self, gen: Generation, index: int, r: Collected) -> dict:
        reader = gen.tools.parser(self.tool_parser or "") if gen.tools is not None else None
        if reader is None:
            return chat_choice(index, r.text, r.finish_reason, self.logprobs(gen, r.logprobs))
        message = reader.parse(r.text)
        reason = ("tool_calls" if message.tool_calls and r.finish_reason == "stop"
                  else r.finish_reason)
        return chat_choice(index, r.text, reason, self.logprobs(gen, r.logprobs),
                           message.body())

    def request_error(self, gen: Generation, exc: ServiceError) -> ServiceError:
        """An error of the verifier about the structured output of a required or named tool
        choice is about the tools (their parameters did not compile): it names them."""
        tools = gen.tools
        if tools is None or exc.http_status != 400 or \
                not (exc.field or "").startswith("response_format"):
            return exc
        field = "tools" if tools.choice == "required" else \
            f"tools[{[f.name for f in tools.functions].index(tools.name)}].function.parameters"
        return InvalidArgument(field, exc.message.split(": ", 1)[-1])

    def tool_streams(self, gen: Generation, n: int) -> ToolStreams | None:
        if not self.chat or gen.tools is None:
            return None
        return ToolStreams([gen.tools.parser(self.tool_parser or "") for _ in range(n)])

    def chunk(self, cid: str, model: str, choices: list[dict], usage: dict | None = None
              ) -> dict:
        if self.chat:
            return chat_chunk(cid, model, choices, usage)
        return completion_body(cid, model, choices, usage)

    def delta(self, index: int, text: str, reason: str | None, logprobs: dict | None,
              tools: ToolStreams | None = None) -> dict | None:
        """A choice's piece of a stream chunk; None: nothing to send yet."""
        if tools is not None:
            return tools.delta(index, text, reason, logprobs)
        if self.chat:
            return chat_delta(index, text, reason, logprobs)
        return choice_body(index, text, reason, logprobs)
