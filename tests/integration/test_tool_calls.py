"""Tools through the real processes and the official `openai` client: required and named tool
choices give tool calls whose arguments validate against the tool's schema, streamed deltas
reassemble to the non-streamed message, greedy output is the same with speculation on and off,
a tool-call history renders, and bad tools (or auto, which this gateway does not serve) are a
400 naming the field."""

from __future__ import annotations

import json

import jsonschema
import pytest
from services_testlib import on_port, start_healthy

from splitspec.launcher import Service
from splitspec.net import free_port, wait_for_port

pytestmark = pytest.mark.integration

openai = pytest.importorskip("openai")

SPEC_ON = {"mode": "on", "method": "ngram", "num_speculative_tokens": 4}
SPEC_OFF = {"mode": "off"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"enum": ["Paris", "Rome", "Oslo"]}, "days": {"type": "integer", "minimum": 1,
                                                              "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def oa(stack):
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


@pytest.fixture(scope="module")
def model(oa):
    return oa.models.list().data[0].id


@pytest.fixture(scope="module")
def auto_oa(stack, tmp_path_factory):
    """A client of a second gateway, started with --enable-auto-tool-choice, over the stack's
    verifier."""
    grpc_port, http_port = free_port(), free_port()
    gateway = Service("gateway-auto-tools", [
        *on_port(stack.gateway.argv, grpc_port, "--grpc-port", "--http-port", str(http_port)),
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes"], grpc_port,
        tmp_path_factory.mktemp("auto-tools") / "gateway.log")
    try:
        start_healthy(gateway, stack.config.startup_timeout_s)
        assert wait_for_port("127.0.0.1", http_port, 60)
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused",
                            max_retries=0, timeout=60)
    finally:
        gateway.stop()


def ask(oa, model, tool_choice, speculation=SPEC_OFF, **kw):
    return oa.chat.completions.create(
        model=model, messages=kw.pop("messages", MESSAGES), tools=[WEATHER, TIME],
        tool_choice=tool_choice, max_tokens=kw.pop("max_tokens", 48), temperature=0,
        extra_body={"speculation": speculation}, **kw)


def calls_of(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def streamed(oa, model, tool_choice, **kw) -> tuple[str | None, list[tuple[str, str]], str]:
    """(content, calls, finish_reason) as a client reassembles them from the chunks."""
    content, calls, finish = "", {}, None
    for chunk in ask(oa, model, tool_choice, stream=True, **kw):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for frag in choice.delta.tool_calls or []:
            call = calls.setdefault(frag.index, {"id": None, "name": "", "arguments": ""})
            if frag.id:
                assert call["id"] is None and frag.id.startswith("call_") and frag.type == \
                    "function"
                call["id"] = frag.id
            call["name"] += frag.function.name or ""
            call["arguments"] += frag.function.arguments or ""
        finish = choice.finish_reason or finish
    return content or None, [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)], \
        finish


@pytest.mark.parametrize("tool_choice", ["required", NAMED], ids=["required", "named"])
def test_tool_calls_validate_and_stream_to_the_same_message(oa, model, tool_choice):
    out = ask(oa, model, tool_choice, parallel_tool_calls=False)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    if tool_choice == NAMED:
        assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    content, calls, finish = streamed(oa, model, tool_choice, parallel_tool_calls=False)
    assert (content, calls, finish) == (None, calls_of(choice.message), "tool_calls")


def test_greedy_required_calls_are_the_same_with_speculation_on_and_off(oa, model):
    on_out = ask(oa, model, "required", SPEC_ON, max_tokens=96)
    on, off = on_out.choices[0], ask(oa, model, "required", SPEC_OFF, max_tokens=96).choices[0]
    assert calls_of(on.message) == calls_of(off.message) and calls_of(on.message)
    assert on.finish_reason == off.finish_reason
    assert on_out.usage.model_extra["speculation"]["accepted_tokens"] > 0  # it did speculate


def test_a_tool_call_history_renders_and_the_reply_is_text(oa, model):
    first = ask(oa, model, NAMED, parallel_tool_calls=False).choices[0].message
    history = [*MESSAGES, first.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "18 C"}]
    out = ask(oa, model, "none", messages=history, max_tokens=8)
    assert out.choices[0].message.tool_calls is None
    assert out.choices[0].finish_reason in ("stop", "length") and out.usage.prompt_tokens > \
        ask(oa, model, "none", max_tokens=1).usage.prompt_tokens


@pytest.mark.parametrize("tools, tool_choice, param", [
    ([{"type": "function", "function": {"description": "no name"}}], "required",
     "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}], "required",
     "tools[0].function.parameters"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}},
     "tool_choice.function.name"),
    ([WEATHER], "auto", "tool_choice"),  # this gateway runs without --enable-auto-tool-choice
])
def test_bad_tools_are_a_400_naming_the_field(oa, model, tools, tool_choice, param):
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model=model, messages=MESSAGES, tools=tools,
                                   tool_choice=tool_choice, max_tokens=4)
    assert e.value.body["param"] == param


@pytest.mark.parametrize("tool_choice, param", [
    ("required", "tools"), ({"type": "function", "function": {"name": "f"}},
                            "tools[1].function.parameters")])
def test_parameters_that_do_not_compile_are_a_400_naming_the_tools(oa, model, tool_choice,
                                                                    param):
    """A schema valid against the metaschema that the grammar compiler cannot take (a $ref
    to nothing): the verifier's refusal names the tools, not a response_format."""
    broken = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            oa.chat.completions.create(model=model, messages=MESSAGES, tools=[TIME, broken],
                                       tool_choice=tool_choice, max_tokens=4, stream=stream)
        assert e.value.body["param"] == param and "does not compile" in \
            e.value.body["message"], e.value.body


def test_auto_is_served_with_the_flag_and_plain_text_stays_content(auto_oa, model):
    """The toy model writes no <tool_call>: its reply is content, streamed or not alike."""
    out = ask(auto_oa, model, "auto", max_tokens=24)
    choice = out.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert streamed(auto_oa, model, "auto", max_tokens=24) == (
        choice.message.content, [], choice.finish_reason)
