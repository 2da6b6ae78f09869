"""The OpenAI completions schema: JSON body -> validated CompletionRequest, and the response
and stream-chunk bodies. Pure functions; no I/O. The fields every generation request shares
(sampling, stopping, speculation, n, logprobs, streaming) are parsed here for chat too
(gateway/chat.py).

Extensions beyond OpenAI's fields: `top_k`, `min_p`, `ignore_eos`, `stop_token_ids`, and
`speculation` (`{"mode": "on"|"off"|"auto", "method": "ngram"|"draft"|"mlp",
"num_speculative_tokens": k, "details": bool}`); the response's `usage.speculation` reports
proposed and accepted draft tokens, and with `details` also acceptance per draft position and per
step. `cache_salt` (vLLM's name) keeps a request's prefix-cache blocks apart from those of
requests with another salt; `usage.prompt_tokens_details.cached_tokens` (OpenAI's field) says how
many prompt tokens the prefix cache served.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from splitspec.errors import InvalidArgument
from splitspec.params import (
    MAX_TOP_LOGPROBS,
    LookaheadParams,
    SamplingParams,
    SpeculationMode,
    SpeculationRequest,
    StoppingCriteria,
    check_cache_salt,
    check_token_ids,
)

Prompt = str | list[int]

MAX_N = 16  # choices per request
SPECULATION_FIELDS = ("mode", "method", "num_speculative_tokens", "details", "num_branches",
                      "lookahead")
LOOKAHEAD_FIELDS = ("window", "ngram", "guesses")

# Fields of every generation request (completions and chat).
# Accepted for compatibility when they ask for the default behaviour only.
NEUTRAL_FIELDS = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None}
IGNORED_FIELDS = {"user", "model", "stream_options"}
GENERATION_FIELDS = {"max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                     "n", "stream", "ignore_eos", "speculation", "stop_token_ids", "cache_salt",
                     *NEUTRAL_FIELDS, *IGNORED_FIELDS}
# Completions only.
_COMPLETION_NEUTRAL = {"best_of": 1, "echo": False, "suffix": None}
COMPLETION_FIELDS = {"prompt", "logprobs", *_COMPLETION_NEUTRAL, *GENERATION_FIELDS}


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
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        reason = ("nests too deeply" if isinstance(exc, RecursionError)
                  else "is not valid JSON" if isinstance(exc, json.JSONDecodeError)
                  else "has a number out of range")
        raise InvalidArgument("body", reason) from None
    _check_unicode(body)
    return body


def _check_unicode(body: Any) -> None:
    """JSON may escape a lone surrogate ("\\ud800"), which no text encoding (nor protobuf)
    takes: a 400 naming the top-level field that holds one, before anything reads it."""
    todo = [(k, v) for k, v in body.items()] if isinstance(body, dict) else [("body", body)]
    while todo:
        field, value = todo.pop()
        if isinstance(value, str) and not _utf8(value):
            raise InvalidArgument(field, "must be valid Unicode (no lone surrogates)")
        if isinstance(value, dict):
            todo += [(field, k) for k in value] + [(field, v) for v in value.values()]
        elif isinstance(value, list):
            todo += [(field, v) for v in value]


def parse_completion_request(body: Any, max_prompts: int = 16) -> CompletionRequest:
    _check_fields(body, COMPLETION_FIELDS, _COMPLETION_NEUTRAL)
    top = _get(body, "logprobs", int, None)
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidArgument("logprobs", f"must be in [0, {MAX_TOP_LOGPROBS}]")
    return CompletionRequest(_parse_prompts(body, max_prompts),
                             parse_generation(body, top_logprobs=top))


def _check_fields(body: Any, known: set[str], neutral: dict[str, Any]) -> None:
    if not isinstance(body, dict):
        raise InvalidArgument("body", "must be a JSON object")
    unknown = sorted(set(body) - known)
    if unknown:
        if not unknown[0]:
            raise InvalidArgument("body", "has a field with an empty name")
        raise InvalidArgument(unknown[0], "is not a supported field")
    for name, value in {**NEUTRAL_FIELDS, **neutral}.items():
        if body.get(name, value) not in (value, None):
            raise InvalidArgument(name, f"is not supported (only {value!r})")


def parse_generation(body: dict, max_tokens_field: str = "max_tokens",
                     top_logprobs: int | None = None) -> Generation:
    """The fields shared by completions and chat; `body` passed _check_fields."""
    n = _get(body, "n", int, 1)
    if not 1 <= n <= MAX_N:
        raise InvalidArgument("n", f"must be in [1, {MAX_N}]")
    stream_options = _get(body, "stream_options", dict, None) or {}
    top_k = _get(body, "top_k", int, 0)
    sampling = SamplingParams(
        temperature=_get(body, "temperature", float, 1.0),
        top_p=_get(body, "top_p", float, 1.0),
        top_k=0 if top_k == -1 else top_k,  # -1 (off) as in other servers
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
    stopping = StoppingCriteria(max_tokens=_get(body, max_tokens_field, int, 16), stop=stops,
                                stop_token_ids=tuple(stop_ids),
                                ignore_eos=_get(body, "ignore_eos", bool, False))
    if not 1 <= stopping.max_tokens < 2**31:  # name the field the request used
        raise InvalidArgument(max_tokens_field, "must be in [1, 2**31)")
    stopping.validate()
    speculation = _parse_speculation(body.get("speculation"))
    include_usage = stream_options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise InvalidArgument("stream_options.include_usage", "must be a boolean")
    cache_salt = body.get("cache_salt")
    check_cache_salt("cache_salt", cache_salt)
    if cache_salt is not None and not _utf8(cache_salt):  # JSON may escape a lone surrogate
        raise InvalidArgument("cache_salt", "must be valid Unicode (no lone surrogates)")
    return Generation(
        model=_get(body, "model", str, None), sampling=sampling, stopping=stopping,
        speculation=speculation, n=n, stream=_get(body, "stream", bool, False),
        include_usage=include_usage, top_logprobs=top_logprobs, cache_salt=cache_salt)


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
    for x in prompts:
        if not isinstance(x, str):
            check_token_ids("prompt", x)
    return prompts


def _parse_speculation(spec: Any) -> SpeculationRequest:
    """JSON types here; the values are checked once, by the policy (SpeculationRequest.validate
    against the served methods and the deployment's largest k), before anything is sent."""
    if spec is None:
        return SpeculationRequest()
    if not isinstance(spec, dict):
        raise InvalidArgument("speculation", "must be an object")
    unknown = sorted(set(spec) - set(SPECULATION_FIELDS))
    if unknown:
        raise InvalidArgument(f"speculation.{unknown[0]}", "is not a supported field")
    mode = spec.get("mode", "auto")
    if not isinstance(mode, str) or mode not in {m.value for m in SpeculationMode}:
        raise InvalidArgument("speculation.mode", "must be 'on', 'off' or 'auto'")
    method = spec.get("method")
    if method is not None and not isinstance(method, str):
        raise InvalidArgument("speculation.method", "must be a string")
    k = spec.get("num_speculative_tokens")
    if k is not None and not _is_int(k):
        raise InvalidArgument("speculation.num_speculative_tokens", "must be an integer")
    details = spec.get("details", False)
    if not isinstance(details, bool):
        raise InvalidArgument("speculation.details", "must be a boolean")
    branches = spec.get("num_branches")
    if branches is not None and not _is_int(branches):
        raise InvalidArgument("speculation.num_branches", "must be an integer")
    return SpeculationRequest(mode=SpeculationMode(mode), method=method,
                              num_speculative_tokens=k, details=details, num_branches=branches,
                              lookahead=_parse_lookahead(spec.get("lookahead")))


def _parse_lookahead(body) -> LookaheadParams | None:
    """`speculation.lookahead`: {"window": W, "ngram": N, "guesses": G}, each optional."""
    if body is None:
        return None
    if not isinstance(body, dict):
        raise InvalidArgument("speculation.lookahead", "must be an object")
    unknown = sorted(set(body) - set(LOOKAHEAD_FIELDS))
    if unknown:
        raise InvalidArgument(f"speculation.lookahead.{unknown[0]}", "is not a supported field")
    for name in LOOKAHEAD_FIELDS:
        if body.get(name) is not None and not _is_int(body[name]):
            raise InvalidArgument(f"speculation.lookahead.{name}", "must be an integer")
    return LookaheadParams(**{name: body.get(name) for name in LOOKAHEAD_FIELDS})


_KIND_NAMES = {float: "a number", int: "an integer", bool: "a boolean", str: "a string",
               dict: "an object"}


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _get(body: dict, name: str, kind: type, default: Any) -> Any:
    v = body.get(name)
    if v is None:
        return default
    if kind is float and (_is_int(v) or isinstance(v, float)):
        try:
            return float(v)
        except OverflowError:  # an integer beyond the float range
            raise InvalidArgument(name, "must be a finite number") from None
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


def error_body(message: str, status: int, param: str | None = None) -> dict:
    kind = ("invalid_request_error" if status == 400 else "not_found_error" if status == 404
            else "rate_limit_error" if status == 429 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
