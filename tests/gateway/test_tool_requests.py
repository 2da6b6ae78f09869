"""Chat requests with tools: the fields parsed and checked (a bad tool is a 400 naming it),
tool_choice turned into the structured output that enforces it (vLLM's schemas), the tools and
the tool-call history put on the wire for the chat template, and responses: a reply read for
calls, and its stream chunks, whose delta.tool_calls reassemble to the non-streamed message."""

from __future__ import annotations

import json

import jsonschema
import pytest

from gateway.chat import Chat, ToolTurn, chat_from_pb
from gateway.frontend import Collected, chat_messages_to_pb
from gateway.request_models import parse_chat_request
from gateway.rest_bodies import GenerationApi
from protos import common_pb2
from splitspec.errors import InvalidArgument
from splitspec.params import StructuredKind

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
USER = [{"role": "user", "content": "Weather in Paris?"}]


def chat(**body):
    return parse_chat_request({"messages": USER, "tools": [WEATHER, TIME], **body})


def schema_of(req) -> dict:
    s = req.generation.sampling.structured
    assert s.kind is StructuredKind.JSON_SCHEMA
    return json.loads(s.spec)


def check_required_is_held_to_an_array_of_calls_one_branch_per_tool():
    schema = schema_of(chat(tool_choice="required"))
    ok = [{"name": "get_weather", "parameters": {"city": "Paris"}},
          {"name": "get_time", "parameters": {}}]
    jsonschema.validate(ok, schema)
    for bad in ([], [{"name": "get_weather", "parameters": {}}],  # city missing
                [{"name": "nope", "parameters": {}}], [{"parameters": {"city": "x"}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    one = schema_of(chat(tool_choice="required", parallel_tool_calls=False))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(ok, one)
    assert list(schema["items"]["anyOf"][0]["properties"]) == ["name", "parameters"]


def test_required_is_held_to_an_array_of_calls_one_branch_per_tool():
    check_required_is_held_to_an_array_of_calls_one_branch_per_tool()


def test_a_named_function_is_held_to_its_parameters():
    req = chat(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert schema_of(req) == WEATHER["function"]["parameters"]
    assert req.generation.tools.choice == "named" and req.generation.tools.name == "get_weather"
    empty = chat(tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert schema_of(empty) == {"type": "object", "properties": {}}


@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_auto_and_none_hold_the_output_to_nothing(choice):
    req = chat(**({} if choice is None else {"tool_choice": choice}))
    assert req.generation.sampling.structured is None
    assert req.generation.tools.choice == (choice or "auto")
    assert parse_chat_request({"messages": USER}).generation.tools is None


def test_tools_and_tool_history_reach_the_wire():
    req = parse_chat_request({"messages": [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"}],
        "tools": [WEATHER], "tool_choice": "none"})
    assert req.chat.turns == (("user", "Weather in Paris?"), ("assistant", ""), ("tool", "18 C"))
    assert [json.loads(t) for t in req.chat.tools] == [WEATHER]
    assert req.chat.tool_turns[1] == ToolTurn((("call_1", "get_weather", '{"city": "Paris"}'),))
    msgs = chat_messages_to_pb(req.chat)
    assert msgs[1].tool_calls[0] == common_pb2.ToolCall(id="call_1", name="get_weather",
                                                         arguments='{"city": "Paris"}')
    assert msgs[2].tool_call_id == "call_1" and msgs[2].name == "get_weather"
    assert chat_messages_to_pb(Chat((("user", "x"),))) == [
        common_pb2.ChatMessage(role="user", content="x")]
    # the public gRPC API's messages and tools reach the verifier as they came
    options = common_pb2.GenerateOptions(messages=msgs, tools=req.chat.tools)
    assert chat_from_pb(options) == req.chat


@pytest.mark.parametrize("body, field", [
    ({"tools": []}, "tools"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [TIME, {"type": "function", "function": {"name": "f", "parameters": {
        "type": "objekt"}}}]}, "tools[1].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "x": 1}}]},
     "tools[0].function.x"),
    ({"tools": [TIME, TIME]}, "tools[1].function.name"),
    ({"tools": [TIME], "tool_choice": "any"}, "tool_choice"),
    ({"tools": [TIME], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TIME], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
     "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "content": None}]}, "messages[0]"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{
        "id": "c", "type": "function", "function": {"name": "f", "arguments": "{x"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
])
def test_bad_tool_requests_name_the_field(body, field):
    with pytest.raises(InvalidArgument) as e:
        parse_chat_request({"messages": USER, **body})
    assert e.value.field == field and e.value.message.startswith(f"{field}: "), e.value.message


def test_auto_needs_the_gateway_to_serve_it():
    body = {"messages": USER, "tools": [TIME]}
    with pytest.raises(InvalidArgument) as e:
        GenerationApi(chat=True).parse(body, 16)
    assert e.value.field == "tool_choice" and "--enable-auto-tool-choice" in e.value.message
    GenerationApi(chat=True).parse({**body, "tool_choice": "required"}, 16)
    GenerationApi(chat=True, tool_parser="hermes").parse(body, 16)


# -- responses --------------------------------------------------------------------------------

AUTO_REPLY = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
              '\n</tool_call>')
REQUIRED_REPLY = '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}]'
NAMED_REPLY = '{"city": "Paris"}'
CASES = {"auto": ({}, AUTO_REPLY), "required": ({"tool_choice": "required"}, REQUIRED_REPLY),
         "named": ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
                   NAMED_REPLY)}


def response(choice: str, text: str, finish: int = common_pb2.FINISH_REASON_STOP):
    """(the non-streamed choice, the stream's choice deltas) for a reply of `text` that
    arrives in pieces of 3 characters."""
    api = GenerationApi(chat=True, tool_parser="hermes")
    _, gen = api.parse({"messages": USER, "tools": [WEATHER, TIME], **CASES[choice][0]}, 16)
    result = Collected()
    result.add(common_pb2.GenerateResponse(text=text, finish_reason=finish))
    body = api.body("id", "m", gen, [result], {})["choices"][0]
    streams = api.tool_streams(gen, 1)
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    deltas = [api.delta(0, p, "stop" if i == len(pieces) - 1 else None, None, streams)
              for i, p in enumerate(pieces)]
    return body, [d for d in deltas if d is not None]


def reassemble(deltas: list[dict]) -> tuple[dict, str]:
    """The message as a client rebuilds it from the deltas (as the openai library does), and
    the last finish_reason."""
    content, calls = "", {}
    for d in deltas:
        content += d["delta"].get("content") or ""
        for frag in d["delta"].get("tool_calls", []):
            call = calls.setdefault(frag["index"], {"id": None, "type": None,
                                                    "function": {"name": "", "arguments": ""}})
            call["id"] = frag.get("id", call["id"])
            call["type"] = frag.get("type", call["type"])
            call["function"]["name"] += frag["function"].get("name", "")
            call["function"]["arguments"] += frag["function"].get("arguments", "")
    message = {"role": "assistant", "content": content or None, "refusal": None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, deltas[-1]["finish_reason"]


def without_ids(message: dict) -> dict:
    return {**message, "tool_calls": [{**c, "id": c["id"][:5]}
                                      for c in message.get("tool_calls", [])]}


def check_stream_reassembles(choice: str) -> dict:
    body, deltas = response(choice, CASES[choice][1])
    message, finish = reassemble(deltas)
    assert without_ids(message) == without_ids(body["message"])
    assert finish == body["finish_reason"] == "tool_calls"
    return body


@pytest.mark.parametrize("choice", list(CASES))
def test_streamed_deltas_reassemble_to_the_message(choice):
    body = check_stream_reassembles(choice)
    (call,) = body["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]),
                        WEATHER["function"]["parameters"])
    assert body["message"]["content"] == ("Checking." if choice == "auto" else None)


def test_required_arguments_stream_as_they_are_generated():
    _, deltas = response("required", REQUIRED_REPLY)
    frags = [d["delta"].get("tool_calls", []) for d in deltas]
    assert all(len({f["index"] for f in fs}) == len(fs) for fs in frags)  # one per call a chunk
    pieces = [f["function"]["arguments"] for fs in frags for f in fs if f["function"]["arguments"]]
    assert len(pieces) > 3 and "".join(pieces) == '{"city": "Paris", "days": 2}'


def test_a_reply_without_calls_or_cut_short_keeps_its_finish_reason():
    body, deltas = response("auto", "Just text.")
    assert body["message"] == {"role": "assistant", "content": "Just text.", "refusal": None}
    assert body["finish_reason"] == "stop" and reassemble(deltas)[0] == body["message"]
    body, _ = response("named", '{"city": "Pa', common_pb2.FINISH_REASON_LENGTH)
    assert body["finish_reason"] == "length"
    assert body["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Pa'
