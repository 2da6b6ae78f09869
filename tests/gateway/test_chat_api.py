"""Chat request parsing: messages, the max_completion_tokens alias, logprobs fields, and errors
naming the field."""

from __future__ import annotations

import pytest

from gateway.chat import Chat, chat_logprobs
from gateway.request_models import parse_chat_request
from protos import common_pb2
from splitspec.errors import InvalidArgument


def test_messages_and_shared_fields():
    r = parse_chat_request({"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text",
                                                                     "text": "there"}]}],
        "max_completion_tokens": 7, "temperature": 0, "n": 2, "seed": 5,
        "logprobs": True, "top_logprobs": 2, "speculation": {"mode": "off"}})
    assert r.chat == Chat((("system", "be brief"), ("user", "hi there")))
    g = r.generation
    assert g.stopping.max_tokens == 7 and g.sampling.greedy and g.top_logprobs == 2
    assert g.choice_seeds() == [5, 6]
    assert parse_chat_request({"messages": [{"role": "user", "content": "x"}],
                               "logprobs": True}).generation.top_logprobs == 0
    assert parse_chat_request({"messages": [{"role": "user", "content": "x"}]}
                              ).generation.top_logprobs is None


@pytest.mark.parametrize("body, field", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "developer", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
     "messages[0].tool_calls"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
     "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
      "max_completion_tokens": 2}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": []}, "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 4,
      "min_tokens": 5}, "min_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"x": 1}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 3},
     "presence_penalty"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
     "response_format.type"),
])
def test_bad_chat_requests_name_the_field(body, field):
    with pytest.raises(InvalidArgument) as e:
        parse_chat_request(body)
    assert e.value.field == field and e.value.message.startswith(f"{field}: ")


def test_chat_logprobs_body():
    entry = common_pb2.TokenLogprob(token_id=3, token="é", logprob=-0.5, top=[
        common_pb2.TopLogprob(token_id=3, token="é", logprob=-0.5)])
    body = chat_logprobs([entry])
    assert body["content"][0] == {"token": "é", "logprob": -0.5, "bytes": [195, 169],
                                  "top_logprobs": [{"token": "é", "logprob": -0.5,
                                                    "bytes": [195, 169]}]}
