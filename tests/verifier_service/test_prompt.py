"""Prompt encoding in the verifier: text and chat messages to token ids off the event loop,
the tokenizer's own chat template when it has one, the default otherwise, --chat-template over
both, tools and tool-call history rendered through the template, and prompts too long for the
context refused before tokenizing."""

from __future__ import annotations

import asyncio
import json

import pytest

from protos import common_pb2
from splitspec.chat_templates import SHIPPED, load_chat_template
from splitspec.errors import InvalidArgument
from splitspec.modelio import load_tokenizer
from verifier_service.prompt import DEFAULT_CHAT_TEMPLATE, PromptEncoder


@pytest.fixture(scope="module")
def tokenizer(target_model_dir):
    return load_tokenizer(target_model_dir, False)


def chat(*turns, **kw) -> common_pb2.GenerateRequest:
    return common_pb2.GenerateRequest(options=common_pb2.GenerateOptions(messages=[
        common_pb2.ChatMessage(role=r, content=c) for r, c in turns]), **kw)


def encode(encoder, req):
    return asyncio.run(encoder.encode(req))


def test_messages_use_the_default_template_when_the_tokenizer_has_none(tokenizer):
    assert not tokenizer.chat_template  # the shipped model has none
    enc = PromptEncoder(tokenizer, 512)
    ids = encode(enc, chat(("system", "S"), ("user", "hi")))
    assert ids == tokenizer.encode("system: S\n\nuser: hi\n\nassistant:",
                                   add_special_tokens=False)
    assert enc.chat_template == DEFAULT_CHAT_TEMPLATE


def test_the_tokenizers_own_template_wins(tokenizer, monkeypatch):
    monkeypatch.setattr(tokenizer, "chat_template",
                        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                        "{% if add_generation_prompt %}<assistant>{% endif %}", raising=False)
    ids = encode(PromptEncoder(tokenizer, 512), chat(("user", "hi")))
    assert ids == tokenizer.encode("<user>hi<assistant>", add_special_tokens=False)


@pytest.mark.parametrize("req, field", [
    (common_pb2.GenerateRequest(text="x" * (512 * 32 + 1)), "prompt"),
    (chat(("user", "x" * (512 * 32 + 1))), "messages"),
    (chat(("developer", "x")), "messages[0].role"),
    (common_pb2.GenerateRequest(options=common_pb2.GenerateOptions(messages=[
        common_pb2.ChatMessage(role="user", content="x", tool_calls=[
            common_pb2.ToolCall(id="c", name="f", arguments="{}")])])),
     "messages[0].tool_calls"),
    (common_pb2.GenerateRequest(options=common_pb2.GenerateOptions(messages=[
        common_pb2.ChatMessage(role="assistant", tool_calls=[
            common_pb2.ToolCall(id="c", name="f", arguments="[1]")])])),
     "messages[0].tool_calls[0].function.arguments"),
    (common_pb2.GenerateRequest(options=common_pb2.GenerateOptions(
        messages=[common_pb2.ChatMessage(role="user", content="x")], tools=['{"type": 1}'])),
     "tools[0]"),
    (chat(("user", "x"), text="y"), "messages"),
    (common_pb2.GenerateRequest(token_ids=common_pb2.TokenIds(ids=[1, -1])), "prompt"),
    (common_pb2.GenerateRequest(), "prompt"),
])
def test_refusals_name_the_field(tokenizer, req, field):
    with pytest.raises(InvalidArgument) as e:
        encode(PromptEncoder(tokenizer, 512), req)
    assert e.value.field == field


# -- tools ------------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def tool_history() -> common_pb2.GenerateRequest:
    """A user question, the assistant's call, the tool's answer: the history of one tool use."""
    return common_pb2.GenerateRequest(options=common_pb2.GenerateOptions(messages=[
        common_pb2.ChatMessage(role="system", content="Be brief."),
        common_pb2.ChatMessage(role="user", content="Weather in Paris?"),
        common_pb2.ChatMessage(role="assistant", tool_calls=[common_pb2.ToolCall(
            id="call_1", name="get_weather", arguments='{"city": "Paris"}')]),
        common_pb2.ChatMessage(role="tool", content="18 C, sunny", tool_call_id="call_1",
                               name="get_weather"),
    ], tools=[json.dumps(WEATHER)]))


def check_the_shipped_template_shows_the_tools_the_call_and_the_tool_result(tokenizer):
    template = load_chat_template("chatml_tools")
    enc = PromptEncoder(tokenizer, 4096, template)
    assert enc.chat_template == template and "chatml_tools" in SHIPPED
    expected = (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\n"
        "You may call one or more functions to help with the request. Their signatures are "
        "listed within <tools></tools> XML tags:\n<tools>\n" + json.dumps(WEATHER) +
        "\n</tools>\n\nTo call a function, reply with a JSON object of its name and arguments "
        "within <tool_call></tool_call> XML tags, one block per call:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    assert encode(enc, tool_history()) == tokenizer.encode(expected, add_special_tokens=False)
    # without tools it is plain ChatML
    plain = encode(enc, chat(("system", "S"), ("user", "hi")))
    assert plain == tokenizer.encode("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi"
                                     "<|im_end|>\n<|im_start|>assistant\n",
                                     add_special_tokens=False)


def test_the_shipped_template_shows_the_tools_the_call_and_the_tool_result(tokenizer):
    check_the_shipped_template_shows_the_tools_the_call_and_the_tool_result(tokenizer)


def test_the_default_template_shows_tools_and_calls_as_hermes_blocks(tokenizer):
    ids = encode(PromptEncoder(tokenizer, 4096), tool_history())
    assert ids == tokenizer.encode(
        "tools:\n" + json.dumps(WEATHER) + "\n\nsystem: Be brief.\n\nuser: Weather in Paris?"
        '\n\nassistant: <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "</tool_call>\n\ntool: 18 C, sunny\n\nassistant:", add_special_tokens=False)


def test_chat_template_flag_reads_a_file_or_a_shipped_name(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    assert load_chat_template(str(path)) == "{{ messages[0]['content'] }}"
    with pytest.raises(ValueError, match="--chat-template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
