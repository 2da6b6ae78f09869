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
    # prompt lookup's range: bounds, order, and only where ngram drafts
    ({"prompt": "x", "speculation": {"prompt_lookup_min": 0}}, "speculation.prompt_lookup_min"),
    ({"prompt": "x", "speculation": {"prompt_lookup_max": 17}},
     "speculation.prompt_lookup_max"),
    ({"prompt": "x", "speculation": {"prompt_lookup_min": 3, "prompt_lookup_max": 2}},
     "speculation.prompt_lookup_min"),
    ({"prompt": "x", "speculation": {"method": "draft", "prompt_lookup_min": 2}},
     "speculation.prompt_lookup_min"),
    ({"prompt": "x", "frobnicate": 1}, "frobnicate"),
    ({"prompt": "x", "": 1}, "body"),
    ({"prompt": "x", "response_format": {"type": "json"}}, "response_format.type"),
    ({"prompt": "x", "best_of": 2}, "best_of"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "suffix": "s"}, "suffix"),
    # the logits processors' fields
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -3}, "frequency_penalty"),
    ({"prompt": "x", "frequency_penalty": "1"}, "frequency_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    # float32 has no 5e-324: the division would make the row's logits inf
    ({"prompt": "x", "repetition_penalty": 5e-324}, "repetition_penalty"),
    ({"prompt": "x", "repetition_penalty": 10.5}, "repetition_penalty"),
    ({"prompt": "x", "logit_bias": {"a": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"1.5": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"-1": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"2147483648": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": "1"}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": [[5, 1]]}, "logit_bias"),
    ({"prompt": "x", "min_tokens": 17}, "min_tokens"),  # above the default max_tokens
    ({"prompt": "x", "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ({"prompt": "x", "min_tokens": -1}, "min_tokens"),
    ({"prompt": "x", "bad_words": [5]}, "bad_words"),
    ({"prompt": "x", "bad_words": "foo"}, "bad_words"),
    ({"prompt": "x", "bad_words": [""]}, "bad_words"),
    ({"prompt": "x", "bad_words": ["w"] * 65}, "bad_words"),
    ({"prompt": "x", "allowed_token_ids": [1.5]}, "allowed_token_ids"),
    ({"prompt": "x", "allowed_token_ids": [2**31]}, "allowed_token_ids"),
])
def test_bad_requests_name_the_field(body, field):
    with pytest.raises(InvalidArgument) as e:
        parse_completion_request(body)
    assert e.value.field == field and e.value.message.startswith(f"{field}: ")


def test_the_logits_processors_fields_reach_the_sampling_parameters():
    s = parse_completion_request({
        "prompt": "x", "max_tokens": 8, "presence_penalty": -2, "frequency_penalty": 2,
        "repetition_penalty": 10, "logit_bias": {"50256": -100, "0": 100}, "min_tokens": 8,
        "bad_words": ["a b"], "allowed_token_ids": []}).sampling
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (-2, 2, 10)
    assert s.logit_bias == ((0, 100.0), (50256, -100.0)) and s.min_tokens == 8
    assert s.bad_words == ("a b",) and s.allowed_token_ids == ()  # empty: every token
    # null is each field's default, as OpenAI's clients may send it
    nulls = parse_completion_request({"prompt": "x", "presence_penalty": None,
                                      "logit_bias": None, "min_tokens": None,
                                      "bad_words": None, "repetition_penalty": None})
    assert not nulls.sampling.has_processors


def test_not_a_json_object():
    with pytest.raises(InvalidArgument, match="body"):
        parse_completion_request([1, 2])
