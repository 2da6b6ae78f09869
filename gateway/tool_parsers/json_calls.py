"""Readers of an output held to a tool schema (tool_choice "required" or a named function; the
schemas are gateway/tools.py's): the arguments stream as the model writes them.

- Named: the whole output is the function's arguments (a JSON object).
- Required: the output is a JSON array of {"name": ..., "parameters": {...}} objects, "name"
  first (the schema lists it first and the grammar keeps that order); each object starts a call
  when its "parameters" value begins, and that value's text is the call's arguments.
"""

from __future__ import annotations

import json

from gateway.tool_parsers.events import (
    Arguments,
    CallStart,
    Event,
    ToolCallParser,
    new_call_id,
)


class NamedCallParser(ToolCallParser):
    def __init__(self, name: str):
        self._name = name
        self._started = False

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        if not self._started and text:
            self._started = True
            out.append(CallStart(0, new_call_id(), self._name))
        if text:
            out.append(Arguments(0, text))
        return out


class RequiredCallsParser(ToolCallParser):
    """A character scanner over the array: depth and strings tracked, the keys of each object
    (depth 2) read, a "name" value kept and a "parameters" value passed through."""

    def __init__(self):
        self._depth = 0
        self._in_str = self._escape = False
        self._str = ""  # a string at depth 2 being read (a key or the name), raw
        self._key: str | None = None  # the key whose value comes next, at depth 2
        self._after_colon = False
        self._name = ""
        self._args_open = False  # passing a "parameters" value through
        self._calls = 0

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        args = []
        for c in text:
            if self._args_open:
                args.append(c)
                self._lex(c)
                if self._depth == 2 and not self._in_str:
                    self._args_open = False
                    out.append(Arguments(self._calls - 1, "".join(args)))
                    args = []
                continue
            if (self._depth == 2 and not self._in_str and self._after_colon
                    and self._key == "parameters" and not c.isspace()):
                self._after_colon = False
                out.append(CallStart(self._calls, new_call_id(), self._name))
                self._calls += 1
                self._args_open = True
                args.append(c)
                self._lex(c)
                if self._depth == 2 and not self._in_str:  # a scalar (not an object)
                    self._args_open = False
                    out.append(Arguments(self._calls - 1, "".join(args)))
                    args = []
                continue
            self._read(c)
        if args:
            out.append(Arguments(self._calls - 1, "".join(args)))
        return out

    def _lex(self, c: str) -> None:
        if self._in_str:
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                self._in_str = False
        elif c == '"':
            self._in_str = True
        elif c in "{[":
            self._depth += 1
        elif c in "}]":
            self._depth -= 1

    def _read(self, c: str) -> None:
        """Outside a parameters value: keys and the name at depth 2."""
        at2 = self._depth == 2
        was_in_str = self._in_str
        self._lex(c)
        if not at2 and self._depth == 2:  # a new object in the array
            self._key, self._after_colon, self._name = None, False, ""
        if not at2:
            return
        if was_in_str or self._in_str:
            self._str += c
            if was_in_str and not self._in_str:  # a string at depth 2 ended
                value = _string(self._str)
                if self._after_colon:
                    if self._key == "name":
                        self._name = value
                    self._after_colon = False
                else:
                    self._key = value
                self._str = ""
        elif c == ":":
            self._after_colon = True
        elif c == ",":
            self._key, self._after_colon = None, False


def _string(raw: str) -> str:
    try:
        return json.loads(raw)
    except ValueError:
        return raw
