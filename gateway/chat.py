"""The OpenAI chat completions schema: JSON body -> validated ChatRequest, and the response and
stream-chunk bodies. Pure functions; no I/O.

The messages travel to the verifier as they are; it renders them with its tokenizer's chat
template, or the documented default (verifier_service/prompt.py), so the template and the
tokenizer always belong together. Sampling, stopping, speculation, `n` and streaming fields are
those of completions (gateway/openai_api.py); `max_completion_tokens` is an alias of
`max_tokens`; `logprobs: true` with `top_logprobs: N` reports log-probabilities.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from gateway.openai_api import GENERATION_FIELDS, Generation, _check_fields, _get, parse_generation
from splitspec.errors import InvalidArgument
from splitspec.params import MAX_TOP_LOGPROBS

CHAT_ROLES = ("system", "user", "assistant")
MESSAGE_FIELDS = ("role", "content", "name")
CHAT_FIELDS = {"messages", "max_completion_tokens", "logprobs", "top_logprobs",
               *GENERATION_FIELDS}


@dataclass(frozen=True)
class Chat:
    """A conversation as (role, content) turns: the prompt of one chat request."""

    turns: tuple[tuple[str, str], ...]

    @property
    def chars(self) -> int:
        return sum(len(content) for _, content in self.turns)


@dataclass(frozen=True)
class ChatRequest:
    chat: Chat
    generation: Generation


def parse_chat_request(body: Any) -> ChatRequest:
    _check_fields(body, CHAT_FIELDS, {})
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise InvalidArgument("max_completion_tokens", "give max_tokens or this, not both")
    tokens_field = ("max_completion_tokens" if body.get("max_completion_tokens") is not None
                    else "max_tokens")
    logprobs = _get(body, "logprobs", bool, False)
    top = _get(body, "top_logprobs", int, None)
    if top is not None:
        if not logprobs:
            raise InvalidArgument("top_logprobs", "needs logprobs: true")
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise InvalidArgument("top_logprobs", f"must be in [0, {MAX_TOP_LOGPROBS}]")
    return ChatRequest(_parse_messages(body.get("messages")),
                       parse_generation(body, tokens_field, (top or 0) if logprobs else None))


def _parse_messages(messages: Any) -> Chat:
    if not isinstance(messages, list) or not messages:
        raise InvalidArgument("messages", "must be a non-empty list of messages")
    turns = []
    for i, m in enumerate(messages):
        name = f"messages[{i}]"
        if not isinstance(m, dict):
            raise InvalidArgument(name, "must be an object with role and content")
        unknown = sorted(set(m) - set(MESSAGE_FIELDS))
        if unknown:
            raise InvalidArgument(f"{name}.{unknown[0]}", "is not a supported field")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise InvalidArgument(f"{name}.role", f"must be one of {', '.join(CHAT_ROLES)}")
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise InvalidArgument(f"{name}.name", "must be a string")
        turns.append((role, _content(m.get("content"), f"{name}.content")))
    return Chat(tuple(turns))


def _content(content: Any, name: str) -> str:
    """A string, or a list of text parts ({"type": "text", "text": ...}) joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            and set(p) <= {"type", "text"} for p in content):
        return "".join(p["text"] for p in content)
    raise InvalidArgument(name, "must be a string or a list of text parts")


# -- responses ------------------------------------------------------------------------------

def new_chat_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def chat_logprobs(entries) -> dict:
    """OpenAI's chat `logprobs` object from TokenLogprob messages."""
    def item(token: str, logprob: float) -> dict:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {"content": [item(e.token, e.logprob) | {
        "top_logprobs": [item(t.token, t.logprob) for t in e.top]} for e in entries],
        "refusal": None}


def chat_body(cid: str, model: str, choices: list[dict], usage: dict | None) -> dict:
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage, "system_fingerprint": None}


def chat_choice(index: int, text: str, finish_reason: str | None,
                logprobs: dict | None = None) -> dict:
    return {"index": index, "message": {"role": "assistant", "content": text, "refusal": None},
            "logprobs": logprobs, "finish_reason": finish_reason}


def chat_chunk(cid: str, model: str, choices: list[dict], usage: dict | None = None) -> dict:
    return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage, "system_fingerprint": None}


def chat_delta(index: int, text: str | None, finish_reason: str | None,
               logprobs: dict | None = None, first: bool = False) -> dict:
    delta: dict = {"role": "assistant"} if first else {}
    if text or first:
        delta["content"] = text or ""
    return {"index": index, "delta": delta, "logprobs": logprobs,
            "finish_reason": finish_reason}
