"""splitspec/wire.py, the request parameters: sampling and stopping round-trip, the client's
speculation config is read field by field, an absent message or a proto3 zero means the
documented default, values the wire cannot tell apart keep their meaning (seed 0, k 0), and an
enum value the code does not know is INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import grpc
import pytest

from protos import common_pb2 as pb
from splitspec.errors import InvalidArgument
from splitspec.params import SamplingParams, SpeculationMode, SpeculationRequest, StoppingCriteria
from splitspec.wire import (
    FINISH_REASON_FROM_NAME,
    FINISH_REASON_NAMES,
    sampling_from_pb,
    sampling_to_pb,
    speculation_from_pb,
    stopping_from_pb,
    stopping_to_pb,
)

# -- sampling ------------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [
    SamplingParams(),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=123),
    SamplingParams(temperature=1.3, seed=0),  # seed 0 is a seed, not "unset"
    SamplingParams(seed=2**63 - 1),
    SamplingParams(temperature=0.0, presence_penalty=-0.5, frequency_penalty=1.5,
                   repetition_penalty=1.2, logit_bias=((3, -100.0), (70, 2.5)), min_tokens=4,
                   bad_words=("foo", "bar baz"), allowed_token_ids=(1, 5, 9)),
])
def test_sampling_round_trips(params):
    assert sampling_from_pb(sampling_to_pb(params)) == params


def test_sampling_message_round_trips():
    msg = pb.SamplingParams(temperature=0.5, top_p=0.8, top_k=7, min_p=0.2, seed=9)
    assert sampling_to_pb(sampling_from_pb(msg)) == msg


def test_an_absent_sampling_message_means_the_defaults():
    set_but_absent = pb.SamplingParams(temperature=0.1, top_k=3, seed=4)
    assert sampling_from_pb(set_but_absent, has_field=False) == SamplingParams()


def test_a_present_empty_sampling_message_is_greedy_with_every_filter_off():
    assert sampling_from_pb(pb.SamplingParams()) == SamplingParams(
        temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None)


def test_top_p_zero_and_top_k_minus_one_mean_off():
    got = sampling_from_pb(pb.SamplingParams(temperature=1.0, top_p=0.0, top_k=-1))
    assert (got.top_p, got.top_k) == (1.0, 0)


@pytest.mark.parametrize("msg, field", [
    (pb.SamplingParams(temperature=-1.0), "temperature"),
    (pb.SamplingParams(top_p=-0.5), "top_p"),
    (pb.SamplingParams(top_k=-2), "top_k"),  # only -1 means off
    (pb.SamplingParams(min_p=1.5), "min_p"),
    (pb.SamplingParams(seed=2**63), "seed"),
])
def test_values_left_to_the_caller_arrive_unchanged_for_its_check_to_name(msg, field):
    params = sampling_from_pb(msg)
    assert getattr(params, field) == getattr(msg, field)
    with pytest.raises(InvalidArgument) as err:
        params.validate("sampling.")
    assert err.value.field == "sampling." + field


# -- stopping ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stopping", [
    StoppingCriteria(),
    StoppingCriteria(max_tokens=1),
    StoppingCriteria(max_tokens=300, stop=("\n\n", "END"), stop_token_ids=(2, 50),
                     ignore_eos=True),
])
def test_stopping_round_trips(stopping):
    assert stopping_from_pb(stopping_to_pb(stopping)) == stopping


def test_stopping_message_round_trips():
    msg = pb.StoppingCriteria(max_tokens=12, stop=["x"], stop_token_ids=[0, 7], ignore_eos=True)
    assert stopping_to_pb(stopping_from_pb(msg)) == msg


def test_absent_stopping_and_zero_max_tokens_mean_the_defaults():
    assert stopping_from_pb(pb.StoppingCriteria(max_tokens=5), has_field=False) == \
        StoppingCriteria()
    got = stopping_from_pb(pb.StoppingCriteria(stop=["\n"]))
    assert got.max_tokens == StoppingCriteria().max_tokens and got.stop == ("\n",)


# -- speculation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("pb_mode, mode", [(pb.SPECULATION_MODE_AUTO, SpeculationMode.AUTO),
                                            (pb.SPECULATION_MODE_ON, SpeculationMode.ON),
                                            (pb.SPECULATION_MODE_OFF, SpeculationMode.OFF)])
@pytest.mark.parametrize("method, k", [(None, None), ("ngram", 4), ("draft", 0), (None, 2)])
def test_speculation_config_is_read_field_by_field(pb_mode, mode, method, k):
    msg = pb.SpeculationConfig(mode=pb_mode, method=method or "")
    if k is not None:
        msg.num_speculative_tokens = k
    got = speculation_from_pb(pb.SpeculationConfig.FromString(msg.SerializeToString()))
    assert (got.mode, got.method, got.num_speculative_tokens) == (mode, method, k)


def test_speculation_defaults_when_fields_are_absent():
    assert speculation_from_pb(pb.SpeculationConfig()) == SpeculationRequest()
    got = speculation_from_pb(pb.SpeculationConfig(mode=pb.SPECULATION_MODE_ON, method=""))
    assert got.method is None and got.num_speculative_tokens is None  # the deployment's
    zero = speculation_from_pb(pb.SpeculationConfig(num_speculative_tokens=0))
    assert zero.num_speculative_tokens == 0  # set to 0 is not unset


def test_every_wire_mode_has_a_meaning():
    assert {speculation_from_pb(pb.SpeculationConfig(mode=v)).mode
            for v in pb.SpeculationMode.values()} == set(SpeculationMode)


@pytest.mark.parametrize("msg", [
    pb.SpeculationConfig(mode=max(pb.SpeculationMode.values()) + 1),
    pb.SpeculationConfig(mode=99),
    pb.SpeculationConfig.FromString(b"\x08\x2a"),  # mode 42 from a newer client, as sent
])
def test_an_unknown_mode_is_invalid_argument_naming_the_field(msg):
    with pytest.raises(InvalidArgument) as err:
        speculation_from_pb(msg)
    assert err.value.field == "speculation.mode"
    assert err.value.message.startswith("speculation.mode:")
    assert str(msg.mode) in err.value.message
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT


# -- finish reasons ------------------------------------------------------------------------------


def test_every_finish_reason_has_a_name_and_the_names_map_back():
    assert set(FINISH_REASON_NAMES) == set(pb.FinishReason.values())
    assert FINISH_REASON_NAMES[pb.FINISH_REASON_UNSPECIFIED] is None  # not finished yet
    assert {FINISH_REASON_NAMES[v]: v for v in FINISH_REASON_FROM_NAME.values()} == \
        FINISH_REASON_FROM_NAME
    assert set(FINISH_REASON_FROM_NAME) == {"length", "stop", "abort"}
