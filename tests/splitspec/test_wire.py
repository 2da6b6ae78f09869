"""The protobuf edge of the request types (splitspec/wire.py): the speculation plan crosses from
the gateway to the verifier unchanged, and the client's SpeculationConfig is read as sent."""

from __future__ import annotations

import pytest

from protos import common_pb2
from splitspec.errors import InvalidArgument
from splitspec.params import (
    LookaheadParams,
    SpeculationMode,
    SpeculationPlan,
    SpeculationRequest,
)
from splitspec.wire import plan_from_pb, plan_to_pb, speculation_from_pb


@pytest.mark.parametrize("plan", [
    SpeculationPlan(),
    SpeculationPlan(details=True),
    SpeculationPlan("ngram", 4),
    SpeculationPlan("mlp", 3, adaptive=True, k_min=0, details=True),
    SpeculationPlan("draft", 2, adaptive=True, k_min=1),
    SpeculationPlan("ngram", 6, num_branches=3),
    SpeculationPlan("lookahead", 8, lookahead=LookaheadParams(4, 3, 0)),
    SpeculationPlan("lookahead", 8, lookahead=LookaheadParams(window=2)),  # the rest: defaults
    SpeculationPlan("ngram", 10, prompt_lookup_min=1, prompt_lookup_max=3),
    SpeculationPlan("hybrid:suffix|ngram", 4, prompt_lookup_max=2),  # min: the proposer's
])
def test_a_plan_crosses_the_wire_unchanged(plan):
    msg = common_pb2.GenerateRequest.FromString(
        common_pb2.GenerateRequest(speculation_plan=plan_to_pb(plan)).SerializeToString())
    assert plan_from_pb(msg.speculation_plan) == plan


def test_an_off_plan_is_sent_as_off_whatever_it_holds():
    assert plan_to_pb(SpeculationPlan("ngram", 0)) == common_pb2.SpeculationPlan()
    assert plan_to_pb(SpeculationPlan(None, 3)) == common_pb2.SpeculationPlan()
    assert not plan_from_pb(common_pb2.SpeculationPlan(method="ngram")).enabled


def test_the_clients_config_is_read_as_sent():
    msg = common_pb2.SpeculationConfig(mode=common_pb2.SPECULATION_MODE_ON, method="ngram",
                                       num_speculative_tokens=0, details=True)
    assert speculation_from_pb(msg) == SpeculationRequest(SpeculationMode.ON, "ngram", 0, True)
    assert speculation_from_pb(common_pb2.SpeculationConfig()) == SpeculationRequest()
    with pytest.raises(InvalidArgument, match="speculation.mode"):
        speculation_from_pb(common_pb2.SpeculationConfig(mode=7))


def test_a_lookahead_shape_is_validated_once_naming_the_field():
    msg = common_pb2.SpeculationConfig(method="lookahead",
                                       lookahead=common_pb2.LookaheadConfig(ngram=3))
    req = speculation_from_pb(msg)
    assert req.lookahead == LookaheadParams(None, 3, None) and req.validate() is req
    for shape, field in ((LookaheadParams(window=0), "window"), (LookaheadParams(ngram=9), "ngram"),
                         (LookaheadParams(guesses=17), "guesses")):
        with pytest.raises(InvalidArgument) as e:
            SpeculationRequest(method="lookahead", lookahead=shape).validate()
        assert e.value.field == f"speculation.lookahead.{field}"
    with pytest.raises(InvalidArgument) as e:  # only lookahead reads it
        SpeculationRequest(method="ngram", lookahead=LookaheadParams(window=2)).validate()
    assert e.value.field == "speculation.lookahead"


def test_prompt_lookups_range_is_read_as_sent_and_validated_naming_the_field():
    msg = common_pb2.SpeculationConfig(method="ngram", prompt_lookup_min=2, prompt_lookup_max=3)
    req = speculation_from_pb(msg)
    assert (req.prompt_lookup_min, req.prompt_lookup_max) == (2, 3)
    assert req.validate(("ngram",)) is req
    assert speculation_from_pb(common_pb2.SpeculationConfig()).prompt_lookup_min is None
    bad = [(dict(prompt_lookup_min=0), "speculation.prompt_lookup_min"),
           (dict(prompt_lookup_max=17), "speculation.prompt_lookup_max"),
           (dict(prompt_lookup_min=4, prompt_lookup_max=3), "speculation.prompt_lookup_min"),
           (dict(method="draft", prompt_lookup_max=3), "speculation.prompt_lookup_max")]
    for fields, name in bad:
        with pytest.raises(InvalidArgument) as e:
            SpeculationRequest(**fields).validate()
        assert e.value.field == name
    # a hybrid with ngram is shaped by it; a deployment without an n-gram proposer refuses it
    SpeculationRequest(method="hybrid:suffix|ngram", prompt_lookup_min=2).validate()
    with pytest.raises(InvalidArgument) as e:
        SpeculationRequest(prompt_lookup_min=2).validate(("draft",))
    assert e.value.field == "speculation.prompt_lookup_min" and "no 'ngram'" in str(e.value)
