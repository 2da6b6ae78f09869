"""The Hermes tool-call format (NousResearch Hermes 2 Pro, Qwen2.5, and the ChatML template
shipped in splitspec/chat_templates/): each call is a JSON object between tags,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

and any text outside the tags is the message's content. Streamed, text that may be the start of
`<tool_call>` is held back until it is known not to be; a call is released whole when its
closing tag arrives. A block whose JSON is not a call ({"name": str, "arguments": object}) stays
content, verbatim; so does an unclosed one, unless it is a complete call (the output ended
before the closing tag). Whitespace just before a call, or at the end of a reply with calls, is
dropped."""

from __future__ import annotations

import json

from gateway.tool_parsers.events import (
    Arguments,
    CallStart,
    Content,
    Event,
    ToolCallParser,
    new_call_id,
)

START, END = "<tool_call>", "</tool_call>"


def _call(body: str) -> tuple[str, dict] | None:
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    return (call["name"], arguments) if isinstance(arguments, dict) else None


def _held(text: str) -> int:
    """How many characters at the end of `text` may begin START."""
    for n in range(min(len(START) - 1, len(text)), 0, -1):
        if START.startswith(text[-n:]):
            return n
    return 0


class HermesParser(ToolCallParser):
    def __init__(self):
        self._buf = ""  # text not yet read: a possible START in content, or a call's body
        self._in_call = False
        self._space = ""  # trailing whitespace of the content so far, not yet released
        self._calls = 0

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while True:
            if self._in_call:
                end = self._buf.find(END)
                if end < 0:
                    return out
                out += self._block(self._buf[:end], closed=True)
                self._buf, self._in_call = self._buf[end + len(END):], False
            else:
                start = self._buf.find(START)
                if start < 0:
                    keep = _held(self._buf)
                    out += self._content(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    return out
                out += self._content(self._buf[:start])
                self._buf, self._in_call = self._buf[start + len(START):], True

    def finish(self) -> list[Event]:
        out = self._block(self._buf, closed=False) if self._in_call else self._content(self._buf)
        self._buf, self._in_call = "", False
        if not self._calls and self._space:
            out.append(Content(self._space))
        self._space = ""
        return out

    def _block(self, body: str, closed: bool) -> list[Event]:
        call = _call(body)
        if call is None:
            return self._content(START + body + (END if closed else ""))
        self._space = ""  # whitespace before a call is not content
        index, self._calls = self._calls, self._calls + 1
        name, arguments = call
        return [CallStart(index, new_call_id(), name),
                Arguments(index, json.dumps(arguments, ensure_ascii=False))]

    def _content(self, text: str) -> list[Event]:
        text = self._space + text
        kept = text.rstrip()
        self._space = text[len(kept):]
        return [Content(kept)] if kept else []
