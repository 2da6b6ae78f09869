"""A request's prompt -> token ids, off the event loop.

Text goes through the tokenizer; chat messages go through the chat template (--chat-template's,
else the tokenizer's, else DEFAULT_CHAT_TEMPLATE when the tokenizer has none, as the shipped
models do) with the assistant's turn opened, then through the tokenizer. A request's tools reach
the template as `tools` (OpenAI tool objects), an assistant turn's calls as its `tool_calls`
(arguments parsed to objects, as the templates that show calls expect) and a tool turn's
`tool_call_id` and `name` as they came. Both run on a thread of their own, never
on the event loop, so a long prompt does not stall other requests or health checks, and a text
longer than the context could hold (splitspec.params.MAX_CHARS_PER_TOKEN characters per token)
is refused before any tokenizing. The thread encodes with its own copy of the tokenizer: a Rust
tokenizer object used from two threads at once can fail ("Already borrowed"), and the event
loop keeps decoding with the engine's.
"""

from __future__ import annotations

import asyncio
import copy
import json
from concurrent.futures import ThreadPoolExecutor

from protos import common_pb2
from splitspec.errors import InvalidArgument
from splitspec.params import check_prompt_chars, check_token_ids

# "role: content" turns separated by a blank line, then "assistant:" for the reply: plain text
# that any tokenizer encodes, for models without a chat template of their own. With tools: a
# "tools:" turn first (one JSON object a line), an assistant turn's calls as Hermes
# <tool_call> blocks (what --tool-call-parser hermes reads).
DEFAULT_CHAT_TEMPLATE = (
    "{% if tools %}tools:{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "<tool_call>{\"name\": {{ call['function']['name'] | tojson }}, \"arguments\": "
    "{{ call['function']['arguments'] | tojson }}}</tool_call>"
    "{% endfor %}{{ '\\n\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
CHAT_ROLES = ("system", "user", "assistant", "tool")


class PromptEncoder:
    """`chat_template`: --chat-template's text; None: the tokenizer's, else the default."""

    def __init__(self, tokenizer, max_model_len: int, chat_template: str | None = None):
        self._tok = copy.deepcopy(tokenizer)  # used by the one tokenize thread only
        self._max_model_len = max_model_len
        self._template = chat_template
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokenize")

    @property
    def chat_template(self) -> str:
        return (self._template or getattr(self._tok, "chat_template", None)
                or DEFAULT_CHAT_TEMPLATE)

    async def encode(self, req: common_pb2.GenerateRequest) -> list[int]:
        which = req.WhichOneof("prompt")
        messages = req.options.messages
        if messages:
            if which is not None:
                raise InvalidArgument("messages", "a request has messages or a prompt, not both")
            for i, m in enumerate(messages):
                if m.role not in CHAT_ROLES:
                    raise InvalidArgument(f"messages[{i}].role",
                                          f"must be one of {', '.join(CHAT_ROLES)}")
            tools = req.options.tools
            check_prompt_chars("messages", sum(len(m.content) for m in messages)
                               + sum(len(c.arguments) for m in messages for c in m.tool_calls)
                               + sum(map(len, tools)), self._max_model_len)
            turns = [_turn(i, m) for i, m in enumerate(messages)]
            return await self._run(self._encode_chat,
                                   (turns, [_tool(i, t) for i, t in enumerate(tools)]))
        if which == "text":
            check_prompt_chars("prompt", len(req.text), self._max_model_len)
            return await self._run(self._encode_text, req.text)
        if which == "token_ids":
            ids = list(req.token_ids.ids)
            check_token_ids("prompt", ids)
            return ids
        raise InvalidArgument("prompt", "is required (text or token_ids)")

    async def _run(self, fn, arg) -> list[int]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, arg)

    def _encode_text(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def _encode_chat(self, chat: tuple[list[dict], list[dict]]) -> list[int]:
        turns, tools = chat
        text = self._tok.apply_chat_template(turns, tools=tools or None,
                                             chat_template=self.chat_template,
                                             tokenize=False, add_generation_prompt=True)
        return self._encode_text(text)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _json_object(field: str, text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InvalidArgument(field, "must be JSON text of an object")
    return value


def _turn(i: int, m: common_pb2.ChatMessage) -> dict:
    """A message as the template reads it."""
    turn: dict = {"role": m.role, "content": m.content}
    if m.tool_calls:
        if m.role != "assistant":
            raise InvalidArgument(f"messages[{i}].tool_calls",
                                  "only an assistant message has tool_calls")
        turn["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.name, "arguments": _json_object(
                f"messages[{i}].tool_calls[{j}].function.arguments", c.arguments)}}
            for j, c in enumerate(m.tool_calls)]
    if m.tool_call_id:
        turn["tool_call_id"] = m.tool_call_id
    if m.name:
        turn["name"] = m.name
    return turn


def _tool(i: int, text: str) -> dict:
    tool = _json_object(f"tools[{i}]", text)
    if not isinstance(tool.get("function"), dict) or not tool["function"].get("name"):
        raise InvalidArgument(f"tools[{i}]", "must be a tool object ({\"type\": \"function\", "
                              "\"function\": {\"name\": ...}})")
    return tool
