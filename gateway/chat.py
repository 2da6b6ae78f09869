"""The OpenAI chat completions API's parsed request (ChatRequest: a Chat and the Generation
fields completions has too) and its response and stream-chunk bodies. Pure functions; no I/O.
The request body is declared in gateway/request_models.py.

The messages travel to the verifier as they are; it renders them with its tokenizer's chat
template, or the documented default (verifier_service/prompt.py), so the template and the
tokenizer always belong together.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from gateway.openai_api import Generation

CHAT_ROLES = ("system", "user", "assistant")


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
