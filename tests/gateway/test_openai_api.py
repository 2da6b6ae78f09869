import pytest

from gateway.request_models import parse_completion_request
from splitspec.errors import InvalidArgument
from splitspec.params import SpeculationMode


def test_defaults_and_extensions():
    r = parse_completion_request({"model": "m", "prompt": "hi"})
    assert r.prompts == ["hi"] and r.stopping.max_tokens == 16 and r.sampling.temperature == 1.0
    assert r.speculation.mode is SpeculationMode.AUTO and not r.stream
    r = parse_completion_request({
        "prompt": [[1, 2], [3]], "max_tokens": 5, "temperature": 0, "top_k": -1, "seed": 3,
        "stop": "\n", "stream": True, "stream_options": {"include_usage": True},
        "speculation": {"mode": "on", "method": "ngram", "num_speculative_tokens": 3}})
    assert r.prompts == [[1, 2], [3]] and r.sampling.greedy and r.sampling.top_k == 0
    assert r.stopping.stop == ("\n",) and r.stream and r.include_usage
    assert (r.speculation.mode, r.speculation.method, r.speculation.num_speculative_tokens) == \
        (SpeculationMode.ON, "ngram", 3)


@pytest.mark.parametrize("body, field", [
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "n": 17}, "n"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "max_tokens": 2**40}, "max_tokens"),
    ({"prompt": [2**40]}, "prompt"),
    ({"prompt": "x", "temperature": 10**400}, "temperature"),
    ({"prompt": "x", "top_k": 2**64}, "top_k"),
    ({"prompt": "x", "stop_token_ids": [2**33]}, "stop_token_ids"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "speculation": {"mode": "sometimes"}}, "speculation.mode"),
    ({"prompt": "x", "speculation": {"num_speculative_tokens": "4"}},
     "speculation.num_speculative_tokens"),
    ({"prompt": "x", "speculation": {"k": 2}}, "speculation.k"),
    ({"prompt": "x", "frobnicate": 1}, "frobnicate"),
    ({"prompt": "x", "": 1}, "body"),
])
def test_bad_requests_name_the_field(body, field):
    with pytest.raises(InvalidArgument) as e:
        parse_completion_request(body)
    assert e.value.field == field


def test_not_a_json_object():
    with pytest.raises(InvalidArgument, match="body"):
        parse_completion_request([1, 2])
