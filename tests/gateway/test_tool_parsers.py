"""Tool-call parsers on text: the Hermes format read out of an auto reply (content kept, calls
read, malformed blocks left as content), the readers of required and named outputs, and every
one of them streamed in pieces split at every position giving the same message as the whole."""

from __future__ import annotations

import json

import pytest

from gateway.tool_parsers import PARSERS, parser_for
from gateway.tool_parsers.events import Arguments, CallStart, Content, fold
from gateway.tool_parsers.hermes import HermesParser

TWO_CALLS = ('Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Paris", "unit": "C"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
             '"arguments": {}}\n</tool_call>\n')
REQUIRED = ('[{"name": "get_weather", "parameters": {"city": "Pa\\"ris]}", "days": [1, {"a": '
            '2}]}}, {"name":"get_time","parameters":{}}]')
NAMED = '{"city": "Paris", "days": 3}'


def calls(message) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message.tool_calls]


def streamed(make, text: str, cuts: tuple[int, ...]):
    """The message folded from `text` fed in the pieces `cuts` split it into."""
    parser, events, last = make(), [], 0
    for cut in (*cuts, len(text)):
        events += parser.feed(text[last:cut])
        last = cut
    return fold(events + parser.finish())


def same(a, b) -> bool:
    """Equal messages, the calls' ids aside (each parse makes new ones)."""
    return a.content == b.content and [c["function"] for c in a.tool_calls] == \
        [c["function"] for c in b.tool_calls]


def check_every_split(make, text: str, pairs: bool = False) -> None:
    whole = make().parse(text)
    cuts = [(i,) for i in range(len(text) + 1)]
    if pairs:
        cuts += [(i, j) for i in range(len(text) + 1) for j in range(i, len(text) + 1)]
    for cut in cuts:
        got = streamed(make, text, cut)
        assert same(got, whole), (cut, got, whole)


def check_hermes_reads_calls_and_keeps_the_text_outside_them():
    message = HermesParser().parse(TWO_CALLS)
    assert message.content == "Let me look that up."
    assert calls(message) == [("get_weather", {"city": "Paris", "unit": "C"}),
                              ("get_time", {})]
    assert all(c["id"].startswith("call_") and c["type"] == "function"
               for c in message.tool_calls)
    assert message.body()["content"] == "Let me look that up."
    assert HermesParser().parse(TWO_CALLS[TWO_CALLS.index("<"):]).body()["content"] is None
    assert PARSERS["hermes"] is HermesParser


def test_hermes_reads_calls_and_keeps_the_text_outside_them():
    check_hermes_reads_calls_and_keeps_the_text_outside_them()


@pytest.mark.parametrize("text, content, n_calls", [
    ("no calls at all, <b>bold</b> <tool", "no calls at all, <b>bold</b> <tool", 0),
    ("  spaced  \n", "  spaced  \n", 0),
    ('a <tool_call>{"name": 5}</tool_call> b', 'a <tool_call>{"name": 5}</tool_call> b', 0),
    ("a <tool_call>not json</tool_call>", "a <tool_call>not json</tool_call>", 0),
    ('x <tool_call>{"name": "f", "arguments": {"a": 1}}', "x", 1),  # ended before the tag
    ('<tool_call>{"name": "f", "arguments": {"a"', '<tool_call>{"name": "f", "arguments": {"a"',
     0),
    ('<tool_call>{"name": "f", "arguments": {}}</tool_call> then text', " then text", 1),
])
def test_hermes_edges(text, content, n_calls):
    message = HermesParser().parse(text)
    assert message.content == content and len(message.tool_calls) == n_calls


@pytest.mark.parametrize("text", [TWO_CALLS, "plain <tool_ text <tool_call", 'a <tool_call>{"x'])
def test_hermes_streamed_at_every_split_is_the_whole(text):
    check_every_split(HermesParser, text, pairs=len(text) < 40)


def test_hermes_holds_back_only_what_may_start_a_call():
    parser = HermesParser()
    assert parser.feed("Hi <tool") == [Content("Hi")]  # " <tool" may start a call
    assert parser.feed("box") == [Content(" <toolbox")]
    parser = HermesParser()
    assert parser.feed('<tool_call>{"name": "f", "arguments": {"a": 1}}') == []
    events = parser.feed("</tool_call>")
    assert [type(e) for e in events] == [CallStart, Arguments]
    assert events[0].name == "f" and json.loads(events[1].text) == {"a": 1}


def test_required_reads_each_name_and_streams_the_parameters_text():
    message = parser_for("required").parse(REQUIRED)
    assert message.content == ""
    assert calls(message) == [("get_weather", {"city": 'Pa"ris]}', "days": [1, {"a": 2}]}),
                              ("get_time", {})]
    parser = parser_for("required")
    events = parser.feed('[{"name": "f", "parameters": {"a": ')
    assert events[0] == CallStart(0, events[0].id, "f") and events[1] == Arguments(0, '{"a": ')
    assert parser.feed("1}") == [Arguments(0, "1}")]  # as the model writes it


def test_named_streams_the_whole_output_as_the_arguments():
    message = parser_for("named", name="get_weather").parse(NAMED)
    assert calls(message) == [("get_weather", {"city": "Paris", "days": 3})]
    assert parser_for("none") is None


@pytest.mark.parametrize("choice, text", [("required", REQUIRED), ("named", NAMED)])
def test_required_and_named_streamed_at_every_split_are_the_whole(choice, text):
    check_every_split(lambda: parser_for(choice, name="get_weather"), text,
                      pairs=len(text) < 40)
