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

CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ToolTurn:
    """A turn's tool fields: an assistant turn's calls (id, name, arguments as JSON text), or
    the call a tool turn answers."""

    tool_calls: tuple[tuple[str, str, str], ...] = ()
    tool_call_id: str = ""
    name: str = ""


@dataclass(frozen=True)
class Chat:
    """A conversation as (role, content) turns: the prompt of one chat request. With tools:
    the tools the template shows the model (OpenAI tool objects as JSON text), and each turn's
    tool fields (`tool_turns`: one per turn, or none at all)."""

    turns: tuple[tuple[str, str], ...]
    tools: tuple[str, ...] = ()
    tool_turns: tuple[ToolTurn, ...] = ()

    @property
    def chars(self) -> int:
        return (sum(len(content) for _, content in self.turns) + sum(map(len, self.tools))
                + sum(len(a) for t in self.tool_turns for _, _, a in t.tool_calls))


def chat_from_pb(options) -> Chat:
    """A Chat from a public gRPC request's GenerateOptions (messages and tools forwarded as
    they came; the verifier checks them)."""
    messages = options.messages
    turns = tuple(ToolTurn(tuple((c.id, c.name, c.arguments) for c in m.tool_calls),
                           m.tool_call_id, m.name) for m in messages)
    return Chat(tuple((m.role, m.content) for m in messages), tuple(options.tools),
                turns if any(t != ToolTurn() for t in turns) else ())


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
                logprobs: dict | None = None, message: dict | None = None) -> dict:
    """`message`: the assistant message when tool calls were read out of `text`."""
    return {"index": index,
            "message": message or {"role": "assistant", "content": text, "refusal": None},
            "logprobs": logprobs, "finish_reason": finish_reason}


def chat_chunk(cid: str, model: str, choices: list[dict], usage: dict | None = None) -> dict:
    return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage, "system_fingerprint": None}


def chat_delta(index: int, text: str | None, finish_reason: str | None,
               logprobs: dict | None = None, first: bool = False,
               tool_calls: list[dict] | None = None) -> dict:
    """`tool_calls`: this chunk's fragments of the message's calls (index, then id, type and
    name once, then argument pieces), which reassemble to message.tool_calls."""
    delta: dict = {"role": "assistant"} if first else {}
    if text or first:
        delta["content"] = text or ""
    if tool_calls:
        delta["tool_calls"] = tool_calls
    return {"index": index, "delta": delta, "logprobs": logprobs,
            "finish_reason": finish_reason}
