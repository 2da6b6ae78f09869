"""The OpenAI completions schema: JSON body -> validated CompletionRequest, and the response
and stream-chunk bodies. Pure functions; no I/O.

Extensions beyond OpenAI's fields: `top_k`, `min_p`, `ignore_eos`, and `speculation`
(`{"mode": "on"|"off"|"auto", "method": "ngram"|"draft"|"mlp", "num_speculative_tokens": k,
"details": bool}`); the response's `usage.speculation` reports proposed and accepted draft
tokens, and with `details` also acceptance per draft position and per step.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from splitspec.errors import InvalidArgument
from splitspec.params import SamplingParams, SpeculationMode, SpeculationRequest, StoppingCriteria

Prompt = str | list[int]

# Accepted for compatibility when they ask for the default behaviour only.
_NEUTRAL_FIELDS = {"presence_penalty": 0, "frequency_penalty": 0, "best_of": 1, "echo": False,
                   "logprobs": None, "suffix": None, "logit_bias": None}
_IGNORED_FIELDS = {"user", "model", "stream_options"}
_KNOWN_FIELDS = {"prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                 "n", "stream", "ignore_eos", "speculation", "stop_token_ids",
                 *_NEUTRAL_FIELDS, *_IGNORED_FIELDS}


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompts: list[Prompt]
    sampling: SamplingParams
    stopping: StoppingCriteria
    speculation: SpeculationRequest
    stream: bool = False
    include_usage: bool = False
    speculation_details: bool = False  # per-position and per-step counts in usage.speculation


def parse_completion_request(body: Any, max_prompts: int = 16) -> CompletionRequest:
    if not isinstance(body, dict):
        raise InvalidArgument("body", "must be a JSON object")
    unknown = sorted(set(body) - _KNOWN_FIELDS)
    if unknown:
        raise InvalidArgument(unknown[0], "is not a supported field")
    for name, neutral in _NEUTRAL_FIELDS.items():
        if body.get(name, neutral) not in (neutral, None):
            raise InvalidArgument(name, f"is not supported (only {neutral!r})")
    if _get(body, "n", int, 1) != 1:
        raise InvalidArgument("n", "only n = 1 is supported")
    model = _get(body, "model", str, None)
    stream_options = _get(body, "stream_options", dict, None) or {}
    sampling = SamplingParams(
        temperature=_get(body, "temperature", float, 1.0),
        top_p=_get(body, "top_p", float, 1.0),
        top_k=max(_get(body, "top_k", int, 0), 0),  # -1 (off) as in other servers
        min_p=_get(body, "min_p", float, 0.0),
        seed=_get(body, "seed", int, None),
    ).validate()
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise InvalidArgument("stop", "must be a string or a list of strings")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(_is_int(t) for t in stop_ids):
        raise InvalidArgument("stop_token_ids", "must be a list of integers")
    stopping = StoppingCriteria(max_tokens=_get(body, "max_tokens", int, 16), stop=stops,
                                stop_token_ids=tuple(stop_ids),
                                ignore_eos=_get(body, "ignore_eos", bool, False)).validate()
    speculation, details = _parse_speculation(body.get("speculation"))
    return CompletionRequest(
        model=model, prompts=_parse_prompts(body, max_prompts), sampling=sampling,
        stopping=stopping, speculation=speculation, stream=_get(body, "stream", bool, False),
        include_usage=bool(stream_options.get("include_usage", False)),
        speculation_details=details)


def _parse_prompts(body: dict, max_prompts: int) -> list[Prompt]:
    if "prompt" not in body or body["prompt"] is None:
        raise InvalidArgument("prompt", "is required")
    p = body["prompt"]
    if isinstance(p, str):
        prompts: list[Prompt] = [p]
    elif isinstance(p, list) and p and all(_is_int(t) for t in p):
        prompts = [list(p)]
    elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        prompts = list(p)
    elif (isinstance(p, list) and p and all(isinstance(x, list) and x for x in p)
          and all(_is_int(t) for x in p for t in x)):
        prompts = [list(x) for x in p]
    else:
        raise InvalidArgument("prompt", "must be a string, a list of strings, a list of token "
                              "ids, or a list of token-id lists (non-empty)")
    if any(isinstance(x, str) and not x for x in prompts):
        raise InvalidArgument("prompt", "must not be empty")
    if len(prompts) > max_prompts:
        raise InvalidArgument("prompt", f"at most {max_prompts} prompts per request")
    return prompts


def _parse_speculation(spec: Any) -> tuple[SpeculationRequest, bool]:
    if spec is None:
        return SpeculationRequest(), False
    if not isinstance(spec, dict):
        raise InvalidArgument("speculation", "must be an object")
    unknown = sorted(set(spec) - {"mode", "method", "num_speculative_tokens", "details"})
    if unknown:
        raise InvalidArgument(f"speculation.{unknown[0]}", "is not a supported field")
    mode = spec.get("mode", "auto")
    try:
        mode = SpeculationMode(mode)
    except ValueError:
        raise InvalidArgument("speculation.mode", "must be 'on', 'off' or 'auto'") from None
    method = spec.get("method")
    if method is not None and not isinstance(method, str):
        raise InvalidArgument("speculation.method", "must be a string")
    k = spec.get("num_speculative_tokens")
    if k is not None and not _is_int(k):
        raise InvalidArgument("speculation.num_speculative_tokens", "must be an integer")
    details = spec.get("details", False)
    if not isinstance(details, bool):
        raise InvalidArgument("speculation.details", "must be a boolean")
    return (SpeculationRequest(mode=mode, method=method, num_speculative_tokens=k).validate(),
            details)


_KIND_NAMES = {float: "a number", int: "an integer", bool: "a boolean", str: "a string",
               dict: "an object"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _get(body: dict, name: str, kind: type, default: Any) -> Any:
    v = body.get(name)
    if v is None:
        return default
    if kind is float and (_is_int(v) or isinstance(v, float)):
        return float(v)
    if kind is int and _is_int(v):
        return v
    if kind in (bool, str, dict) and isinstance(v, kind):
        return v
    raise InvalidArgument(name, f"must be {_KIND_NAMES[kind]}")


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
               proposed: int, accepted: int, steps: int,
               details: SpeculationDetails | None = None, reason: str = "", mode: str = "",
               policy_reason: str = "") -> dict:
    speculation = {"method": method, "num_speculative_tokens": k, "proposed_tokens": proposed,
                   "accepted_tokens": accepted,
                   "acceptance_rate": (accepted / proposed) if proposed else None,
                   "steps": steps}
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
        "speculation": speculation,
    }


def completion_body(cid: str, model: str, choices: list[dict], usage: dict) -> dict:
    return {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage, "system_fingerprint": None}


def choice_body(index: int, text: str, finish_reason: str | None) -> dict:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}


def error_body(message: str, status: int, param: str | None = None) -> dict:
    kind = ("invalid_request_error" if status == 400 else "not_found_error" if status == 404
            else "rate_limit_error" if status == 429 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
