"""Prompt lookup's shape in auto (gateway/policy.py PLD_SHAPE): a chain candidate of its own,
ngram at match range [1, 3], priced from the acceptance the gateway measured for it (overall and
per prompt class) and chosen per request where it measured better than the proposer's own
range; a request that gives its range keeps it. Planted controls (test_policy_prompt_lookup_
controls.py): a policy without the shape among its candidates, and a front door that counts
the shape's usage as plain ngram's."""

from __future__ import annotations

import asyncio

from test_policy import AUTO, INFO, load, policy, snapshot

from gateway.frontend import Frontend
from gateway.policy import PLD_SHAPE, SpeculationPolicy, shaped_name
from protos import common_pb2, verifier_pb2
from splitspec.goodput import LONG_PROMPT_TOKENS
from splitspec.params import SpeculationRequest

PLD = shaped_name(*PLD_SHAPE)
LONG, SHORT = 4 * LONG_PROMPT_TOKENS, 40  # prompt tokens


def finished(p, cls: str, method: str, accepted: int, proposed: int, n: int = 20) -> None:
    """n finished requests of the class run as `method`, as the front door counts them."""
    for _ in range(n):
        p.estimates.observe_request(cls, method, True, 1, accepted, proposed, 10,
                                    overall=method == PLD)


def measured(pld: tuple[int, int]):
    """ngram at its own range and the MLP measured middling; prompt lookup's shape as given."""
    p = policy(snapshot(greedy={"mlp": (400, 1000), "ngram": (400, 1000)}))
    for cls in ("short", "long"):
        finished(p, cls, PLD, *pld)
    return p


def is_shape(plan) -> bool:
    return (plan.method, plan.prompt_lookup_min, plan.prompt_lookup_max) == ("ngram", *PLD_SHAPE)


def test_auto_runs_the_shape_where_it_measured_best():
    d = measured((36, 40)).decide(AUTO, INFO, True, load())
    assert is_shape(d.plan) and d.reason == "goodput", d
    assert d.plan.k >= 1


def test_auto_leaves_the_shape_where_it_measured_worse():
    d = measured((2, 40)).decide(AUTO, INFO, True, load())
    assert d.plan.enabled and not is_shape(d.plan), d
    assert d.plan.prompt_lookup_min == d.plan.prompt_lookup_max == 0


def test_auto_decides_the_shape_per_request_from_the_prompts_class():
    p = policy(snapshot(greedy={"mlp": (400, 1000), "ngram": (400, 1000)}))
    finished(p, "long", PLD, 38, 40)
    finished(p, "short", PLD, 1, 40)
    finished(p, "long", "ngram", 10, 40)
    assert is_shape(p.decide(AUTO, INFO, True, load(), prompt_tokens=LONG).plan)
    assert not is_shape(p.decide(AUTO, INFO, True, load(), prompt_tokens=SHORT).plan)


def test_a_request_that_gives_its_range_keeps_it():
    p = measured((36, 40))
    req = SpeculationRequest(prompt_lookup_min=2, prompt_lookup_max=5)
    d = p.decide(req, INFO, True, load())
    if d.plan.method == "ngram":
        assert (d.plan.prompt_lookup_min, d.plan.prompt_lookup_max) == (2, 5)
    assert not is_shape(d.plan)


class UsagePool:
    """A verifier that answers every request with n-gram usage: 9 of 10 drafts accepted."""

    async def info(self):
        return verifier_pb2.VerifierInfo(
            model="target", max_model_len=512, default_num_speculative_tokens=3,
            max_num_speculative_tokens=8, proposers=[verifier_pb2.ProposerStatus(method="ngram")])

    async def generate(self, request):
        usage = common_pb2.Usage(prompt_tokens=4, completion_tokens=20, speculation=(
            common_pb2.SpeculationStats(method="ngram", num_speculative_tokens=4,
                                        proposed_tokens=40, accepted_tokens=36, steps=10,
                                        rejections=4)))
        yield common_pb2.GenerateResponse(token_ids=[1], text="a", usage=usage,
                                          finish_reason=common_pb2.FINISH_REASON_LENGTH)


def run(speculation: common_pb2.SpeculationConfig) -> SpeculationPolicy:
    """One request through the front door; the policy it measured into."""
    from gateway.grpc_api import GenerationServicer

    p = SpeculationPolicy()
    servicer = GenerationServicer(Frontend(UsagePool(), p))

    async def call():
        return [m async for m in servicer.Generate(common_pb2.GenerateRequest(
            text="x" * 8, sampling=common_pb2.SamplingParams(temperature=0),
            speculation=speculation), None)]

    asyncio.run(call())
    return p


def test_the_shapes_usage_is_measured_under_its_own_name():
    on = common_pb2.SPECULATION_MODE_ON
    shaped = run(common_pb2.SpeculationConfig(mode=on, method="ngram", num_speculative_tokens=4,
                                              prompt_lookup_min=1, prompt_lookup_max=3))
    assert shaped.estimates.acceptance_of(PLD, True).accepted == 36
    assert shaped.estimates.class_acceptance("short", PLD, True).accepted == 36
    assert shaped.estimates.class_acceptance("short", "ngram", True).tried == 0
    plain = run(common_pb2.SpeculationConfig(mode=on, method="ngram", num_speculative_tokens=4))
    assert plain.estimates.class_acceptance("short", "ngram", True).accepted == 36
    assert plain.estimates.acceptance_of(PLD, True).tried == 0
