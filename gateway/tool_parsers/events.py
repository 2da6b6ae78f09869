"""What reading a model's output for tool calls yields, piece by piece: content text, the start
of a call (its id and function name) and fragments of its arguments (JSON text). A parser is fed
the output as it streams and returns these events; the non-streamed message is the same events
folded (`fold`), so a streamed reply always reassembles to the non-streamed one."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int  # the call's place in message.tool_calls
    id: str
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    text: str  # the next piece of the call's arguments (JSON text)


Event = Content | CallStart | Arguments


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class ToolCallParser:
    """Reads one choice's output: `feed` each new piece of text, `finish` once at the end."""

    def feed(self, text: str) -> list[Event]:
        raise NotImplementedError

    def finish(self) -> list[Event]:
        return []

    def parse(self, text: str) -> "Message":
        """The whole output at once: the same events as streaming it, folded."""
        return fold(self.feed(text) + self.finish())


@dataclass
class Message:
    """An assistant message's content and tool calls (each {"id", "type", "function"})."""

    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)

    def body(self) -> dict:
        return {"role": "assistant",
                "content": None if self.tool_calls and not self.content else self.content,
                "refusal": None, **({"tool_calls": self.tool_calls} if self.tool_calls else {})}


def fold(events: list[Event], into: Message | None = None) -> Message:
    out = into or Message()
    for e in events:
        if isinstance(e, Content):
            out.content += e.text
        elif isinstance(e, CallStart):
            out.tool_calls.append({"id": e.id, "type": "function",
                                   "function": {"name": e.name, "arguments": ""}})
        else:
            out.tool_calls[e.index]["function"]["arguments"] += e.text
    return out


def delta_tool_calls(events: list[Event]) -> list[dict]:
    """The `delta.tool_calls` fragments of a stream chunk, one per call it touches (as OpenAI
    sends them): a call's first carries its id, type and name, and each a piece of its
    arguments."""
    out: list[dict] = []
    for e in events:
        if isinstance(e, CallStart):
            out.append({"index": e.index, "id": e.id, "type": "function",
                        "function": {"name": e.name, "arguments": ""}})
        elif isinstance(e, Arguments) and e.text:
            if out and out[-1]["index"] == e.index:
                out[-1]["function"]["arguments"] += e.text
            else:
                out.append({"index": e.index, "function": {"arguments": e.text}})
    return out
