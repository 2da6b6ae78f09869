"""A request's prompt -> token ids, off the event loop.

Text goes through the tokenizer; chat messages go through the tokenizer's chat template (or
DEFAULT_CHAT_TEMPLATE when the tokenizer has none, as the shipped models do) with the
assistant's turn opened, then through the tokenizer. Both run on a thread of their own, never
on the event loop, so a long prompt does not stall other requests or health checks, and a text
longer than the context could hold (splitspec.params.MAX_CHARS_PER_TOKEN characters per token)
is refused before any tokenizing. The thread encodes with its own copy of the tokenizer: a Rust
tokenizer object used from two threads at once can fail ("Already borrowed"), and the event
loop keeps decoding with the engine's.
"""

from __future__ import annotations

import asyncio
import copy
from concurrent.futures import ThreadPoolExecutor

from protos import common_pb2
from splitspec.errors import InvalidArgument
from splitspec.params import check_prompt_chars, check_token_ids

# "role: content" turns separated by a blank line, then "assistant:" for the reply: plain text
# that any tokenizer encodes, for models without a chat template of their own.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
CHAT_ROLES = ("system", "user", "assistant")


class PromptEncoder:
    def __init__(self, tokenizer, max_model_len: int):
        self._tok = copy.deepcopy(tokenizer)  # used by the one tokenize thread only
        self._max_model_len = max_model_len
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokenize")

    @property
    def chat_template(self) -> str:
        return getattr(self._tok, "chat_template", None) or DEFAULT_CHAT_TEMPLATE

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
            check_prompt_chars("messages", sum(len(m.content) for m in messages),
                               self._max_model_len)
            turns = [{"role": m.role, "content": m.content} for m in messages]
            return await self._run(self._encode_chat, turns)
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

    def _encode_chat(self, turns: list[dict]) -> list[int]:
        text = self._tok.apply_chat_template(turns, chat_template=self.chat_template,
                                             tokenize=False, add_generation_prompt=True)
        return self._encode_text(text)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
