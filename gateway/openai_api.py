"""The OpenAI completions API's request and response bodies as the gateway works on them: the
parsed request (CompletionRequest, whose shared fields are a Generation, chat's too), the JSON
body read (parse_json), and the response, stream-chunk, usage and error bodies. Pure functions;
no I/O. The request bodies themselves are declared in gateway/request_models.py, which checks
them and converts them to these.

Extensions beyond OpenAI's fields are listed in docs/api.md; the response's
`usage.speculation` reports proposed and accepted draft tokens, and with `speculation.details`
also acceptance per draft position and per step; `usage.prompt_tokens_details.cached_tokens`
(OpenAI's field) says how many prompt tokens the prefix cache served.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from splitspec.errors import InvalidArgument
from splitspec.params import SamplingParams, SpeculationRequest, StoppingCriteria

if TYPE_CHECKING:
    from gateway.tools import ToolUse

Prompt = str | list[int]

MAX_N = 16  # choices per request


@dataclass(frozen=True)
class Generation:
    """What every generation request asks, whatever its prompt looks like."""

    model: str | None
    sampling: SamplingParams
    stopping: StoppingCriteria
    speculation: SpeculationRequest
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    top_logprobs: int | None = None  # set: report logprobs with this many alternatives
    cache_salt: str | None = None  # prefix-cache isolation (None: the gateway's default)
    tools: "ToolUse | None" = None  # chat with tools: how the output is read for calls

    @property
    def speculation_details(self) -> bool:
        """Per-position and per-step counts in usage.speculation."""
        return self.speculation.details

    def choice_seeds(self) -> list[int | None]:
        """Seed of each of the n choices: choice i draws with seed + i (mod 2**63), so choice 0
        is what the same request with n = 1 returns; unseeded choices stay unseeded."""
        seed = self.sampling.seed
        return [None if seed is None else (seed + i) % 2**63 for i in range(self.n)]

    def choice_sampling(self) -> list[SamplingParams]:
        return [replace(self.sampling, seed=s) for s in self.choice_seeds()]


@dataclass(frozen=True)
class CompletionRequest:
    prompts: list[Prompt]
    generation: Generation

    # the shared fields, read through
    model = property(lambda self: self.generation.model)
    sampling = property(lambda self: self.generation.sampling)
    stopping = property(lambda self: self.generation.stopping)
    speculation = property(lambda self: self.generation.speculation)
    stream = property(lambda self: self.generation.stream)
    include_usage = property(lambda self: self.generation.include_usage)
    speculation_details = property(lambda self: self.generation.speculation_details)


def parse_json(raw: bytes) -> Any:
    """The request body as JSON; what json cannot represent (an integer of thousands of digits,
    nesting deeper than the parser's recursion limit) is a 400 like malformed JSON."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        reason = ("nests too deeply" if isinstance(exc, RecursionError)
                  else "is not valid JSON" if isinstance(exc, json.JSONDecodeError)
                  else "has a number out of range")
        raise InvalidArgument("body", reason) from None


# -- responses ------------------------------------------------------------------------------

def new_completion_id() -> str:
    return "cmpl-" + uuid.uuid4().hex


@dataclass(frozen=True)
class SpeculationDetails:
    """Per-request detail, reported when the request asked for `speculation.details`."""

    accepted_per_position: list[int]  # [j]: steps whose draft token j+1 was accepted
    step_counts: list[tuple[int, int]]  # per step, in order: (draft tokens, accepted)

    def body(self) -> dict:
        # acceptance at position j: of the steps that drafted a token j+1, the share accepted
        drafted = [sum(1 for d, _ in self.step_counts if d > j)
                   for j in range(len(self.accepted_per_position))]
        return {"accepted_per_position": list(self.accepted_per_position),
                "acceptance_per_position": [(a / n) if n else None for a, n in
                                            zip(self.accepted_per_position, drafted)],
                "step_counts": [[d, a] for d, a in self.step_counts]}


def usage_body(prompt_tokens: int, completion_tokens: int, method: str | None, k: int,
               proposed_tokens: int, accepted: int, steps: int,
               details: SpeculationDetails | None = None, reason: str = "", mode: str = "",
               policy_reason: str = "", branch_hits: int = 0, num_branches: int = 0,
               cached_tokens: int = 0) -> dict:
    speculation = {"method": method, "num_speculative_tokens": k,
                   "proposed_tokens": proposed_tokens, "accepted_tokens": accepted,
                   "acceptance_rate": (accepted / proposed_tokens) if proposed_tokens else None,
                   "steps": steps, "branch_hits": branch_hits,
                   "num_branches": max(num_branches, 1) if method else 1}
    if reason:
        speculation["reason"] = reason
    if mode:  # the gateway's decision: the mode asked for, and why the policy chose this
        speculation["mode"], speculation["policy_reason"] = mode, policy_reason
    if details is not None:
        speculation.update(details.body())
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        # of the prompt tokens, those whose KV the verifier's prefix cache held
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
        "speculation": speculation,
    }


def completion_body(cid: str, model: str, choices: list[dict], usage: dict) -> dict:
    return {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage, "system_fingerprint": None}


def choice_body(index: int, text: str, finish_reason: str | None,
                logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def completion_logprobs(entries, text_offset: int = 0) -> dict:
    """OpenAI's completions `logprobs` object from TokenLogprob messages; `text_offset` is where
    the first token's text starts in the choice's text."""
    offsets = []
    for e in entries:
        offsets.append(text_offset)
        text_offset += len(e.token)
    return {"tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.token: t.logprob for t in e.top} for e in entries],
            "text_offset": offsets}


class ApiError(BaseModel):
    message: str
    type: str
    param: str | None = Field(description="the request field at fault")
    code: int


class ErrorBody(BaseModel):
    """Every error response's body (REST), and a stream's error event."""

    error: ApiError


def error_body(message: str, status: int, param: str | None = None) -> dict:
    kind = ("invalid_request_error" if status == 400 else "not_found_error" if status == 404
            else "rate_limit_error" if status == 429 else "server_error")
    return ErrorBody(error=ApiError(message=message, type=kind, param=param, code=status)
                     ).model_dump()
