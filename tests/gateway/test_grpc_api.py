"""The gRPC front door's request handling (gateway/grpc_api.py) against a recording verifier
pool: the client's sampling and stopping messages (logits processors included) are checked and
forwarded as they came, its SpeculationConfig becomes the policy's plan, and bad fields are
refused by their public name before anything reaches a verifier."""

from __future__ import annotations

import asyncio

import pytest

from gateway.frontend import Frontend
from gateway.grpc_api import GenerationServicer
from gateway.policy import SpeculationPolicy
from protos import common_pb2, verifier_pb2
from splitspec.errors import InvalidArgument


class RecordingPool:
    """Records what the gateway sends; answers with one finished message."""

    def __init__(self):
        self.requests: list[common_pb2.GenerateRequest] = []

    async def info(self):
        return verifier_pb2.VerifierInfo(
            model="target", max_model_len=512, default_num_speculative_tokens=3,
            max_num_speculative_tokens=8, proposers=[verifier_pb2.ProposerStatus(method="ngram")])

    async def generate(self, request):
        self.requests.append(request)
        yield common_pb2.GenerateResponse(token_ids=[1], text="a",
                                          finish_reason=common_pb2.FINISH_REASON_LENGTH)


def send(request: common_pb2.GenerateRequest) -> common_pb2.GenerateRequest:
    """What the verifier receives for this public request."""
    pool = RecordingPool()
    servicer = GenerationServicer(Frontend(pool, SpeculationPolicy()))

    async def call():
        return [m async for m in servicer.Generate(request, None)]

    asyncio.run(call())
    (sent,) = pool.requests
    return sent


def test_sampling_and_stopping_are_forwarded_as_they_came():
    sampling = common_pb2.SamplingParams(
        temperature=0.7, top_p=0, top_k=-1, seed=5, presence_penalty=0.5,
        frequency_penalty=-1, repetition_penalty=1.2, logit_bias={7: 3.5, 2: -100},
        min_tokens=7, bad_words=["foo"], allowed_token_ids=[2, 7, 9])
    stopping = common_pb2.StoppingCriteria(max_tokens=7, stop=["\n"], ignore_eos=True)
    sent = send(common_pb2.GenerateRequest(
        request_id="r", token_ids=common_pb2.TokenIds(ids=[1, 2]), sampling=sampling,
        stopping=stopping, speculation=common_pb2.SpeculationConfig(
            mode=common_pb2.SPECULATION_MODE_ON, method="ngram", num_speculative_tokens=2,
            details=True)))
    assert (sent.sampling, sent.stopping) == (sampling, stopping)
    assert list(sent.token_ids.ids) == [1, 2] and sent.request_id == "r"
    # the policy's plan goes to the verifier; the client's config does not
    assert sent.speculation_plan == common_pb2.SpeculationPlan(method="ngram", k=2,
                                                               details=True)
    assert not sent.HasField("speculation")


def test_unset_messages_stay_unset_so_the_verifier_applies_its_defaults():
    sent = send(common_pb2.GenerateRequest(text="x"))
    assert not sent.HasField("sampling") and not sent.HasField("stopping")
    assert sent.HasField("speculation_plan")


@pytest.mark.parametrize("request_fields, field", [
    (dict(sampling=common_pb2.SamplingParams(temperature=-1)), "temperature"),
    (dict(stopping=common_pb2.StoppingCriteria(stop=[""])), "stop"),
    (dict(speculation=common_pb2.SpeculationConfig(num_speculative_tokens=9)),
     "speculation.num_speculative_tokens"),
    (dict(speculation=common_pb2.SpeculationConfig(method="draft")), "speculation.method"),
    (dict(sampling=common_pb2.SamplingParams(temperature=1, presence_penalty=2.5)),
     "presence_penalty"),
    (dict(sampling=common_pb2.SamplingParams(temperature=1, frequency_penalty=float("nan"))),
     "frequency_penalty"),
    (dict(sampling=common_pb2.SamplingParams(temperature=1, repetition_penalty=11)),
     "repetition_penalty"),
    (dict(sampling=common_pb2.SamplingParams(temperature=1, repetition_penalty=1e-3)),
     "repetition_penalty"),
    (dict(sampling=common_pb2.SamplingParams(temperature=1, logit_bias={5: 101})),
     "logit_bias"),
    (dict(sampling=common_pb2.SamplingParams(temperature=1, logit_bias={-1: 1})),
     "logit_bias"),
    (dict(sampling=common_pb2.SamplingParams(temperature=1,
                                             logit_bias={i: 1 for i in range(301)})),
     "logit_bias"),
    (dict(sampling=common_pb2.SamplingParams(temperature=1, min_tokens=17)),
     "min_tokens"),  # above the default max_tokens, 16
    (dict(sampling=common_pb2.SamplingParams(temperature=1, min_tokens=5),
          stopping=common_pb2.StoppingCriteria(max_tokens=4)), "min_tokens"),
    (dict(sampling=common_pb2.SamplingParams(temperature=1, bad_words=["ok", ""])),
     "bad_words"),
    (dict(sampling=common_pb2.SamplingParams(temperature=1, allowed_token_ids=[3, -1])),
     "allowed_token_ids"),
    (dict(options=common_pb2.GenerateOptions(top_logprobs=21)), "top_logprobs"),
    (dict(cache_salt="s" * 257), "cache_salt"),
])
def test_bad_fields_are_refused_by_their_public_name(request_fields, field):
    with pytest.raises(InvalidArgument) as e:
        send(common_pb2.GenerateRequest(text="x", **request_fields))
    assert e.value.field == field and e.value.message.startswith(f"{field}: ")


@pytest.mark.parametrize("config, field", [
    (dict(prompt_lookup_min=0), "speculation.prompt_lookup_min"),
    (dict(prompt_lookup_max=17), "speculation.prompt_lookup_max"),
    (dict(prompt_lookup_min=3, prompt_lookup_max=2), "speculation.prompt_lookup_min"),
])
def test_prompt_lookups_range_is_refused_by_its_public_name(config, field):
    with pytest.raises(InvalidArgument) as e:
        send(common_pb2.GenerateRequest(
            text="x", speculation=common_pb2.SpeculationConfig(**config)))
    assert e.value.field == field and e.value.message.startswith(f"{field}: ")


def test_prompt_lookups_range_reaches_the_verifier_in_the_plan():
    sent = send(common_pb2.GenerateRequest(text="x", speculation=common_pb2.SpeculationConfig(
        mode=common_pb2.SPECULATION_MODE_ON, method="ngram", num_speculative_tokens=4,
        prompt_lookup_min=2, prompt_lookup_max=3)))
    plan = sent.speculation_plan
    assert (plan.method, plan.prompt_lookup_min, plan.prompt_lookup_max) == ("ngram", 2, 3)
