"""Tool-call parsers: how the gateway reads tool calls out of a model's output, one file per
format, named as vLLM names them (--tool-call-parser). `parser_for` also gives the readers of
outputs held to a tool schema (tool_choice "required" or a named function). This room imports
nothing else of the gateway."""

from __future__ import annotations

from collections.abc import Callable

from gateway.tool_parsers.events import ToolCallParser
from gateway.tool_parsers.hermes import HermesParser
from gateway.tool_parsers.json_calls import NamedCallParser, RequiredCallsParser

# --tool-call-parser NAME -> a new parser per choice (auto tool choice)
PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesParser,
}


def parser_for(choice: str, parser: str = "hermes", name: str | None = None
               ) -> ToolCallParser | None:
    """A fresh reader for one choice of a request with tools: `choice` is "auto", "required"
    or "named" (`name` the function); None for "none" (the output is plain content)."""
    if choice == "required":
        return RequiredCallsParser()
    if choice == "named":
        return NamedCallParser(name or "")
    if choice == "auto":
        return PARSERS[parser]()
    return None
