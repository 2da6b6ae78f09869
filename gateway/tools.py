"""Tool use in chat requests, as vLLM serves it: what the request asked (ToolUse) and the JSON
schema that holds the output to the tools when the request requires a call.

- tool_choice "none": the tools are shown to the model (through the chat template), the output
  is plain content.
- "auto" (the default with tools): the model decides; the served format's parser
  (gateway/tool_parsers, --tool-call-parser) reads calls out of the output.
- "required": the output is held (a structured output, json_schema kind) to an array of
  {"name", "parameters"} objects, one anyOf branch per tool, at least one item (at most one
  without parallel_tool_calls).
- a named function: the output is held to that function's parameters schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gateway.tool_parsers import ToolCallParser, parser_for
from splitspec.params import StructuredKind, StructuredOutput

# a function without a parameters schema takes an object of no declared properties
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict | None = None  # a JSON schema; None: none given


@dataclass(frozen=True)
class ToolUse:
    """What a request with tools asked of its output."""

    choice: str  # "none" | "auto" | "required" | "named"
    functions: tuple[Function, ...]
    name: str | None = None  # "named": the function
    parallel: bool = True  # parallel_tool_calls

    def structured(self) -> StructuredOutput | None:
        """The structured output that enforces "required" and "named"; None otherwise."""
        if self.choice == "required":
            schema = required_schema(self.functions, self.parallel)
        elif self.choice == "named":
            (fn,) = [f for f in self.functions if f.name == self.name]
            schema = fn.parameters or EMPTY_PARAMETERS
        else:
            return None
        return StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(schema))

    def parser(self, auto_parser: str) -> ToolCallParser | None:
        """A reader of one choice's output (None: plain content)."""
        return parser_for(self.choice, auto_parser, self.name)


def required_schema(functions: tuple[Function, ...], parallel: bool = True) -> dict:
    """At least one call, each {"name": one of the tools, "parameters": its arguments}: one
    anyOf branch per tool, "name" listed first so that it is written first."""
    def branch(fn: Function) -> dict:
        return {"properties": {"name": {"type": "string", "enum": [fn.name]},
                               "parameters": fn.parameters or EMPTY_PARAMETERS},
                "required": ["name", "parameters"]}

    schema = {"type": "array", "minItems": 1,
              "items": {"type": "object", "anyOf": [branch(f) for f in functions]}}
    if not parallel:
        schema["maxItems"] = 1
    return schema
