"""Fuzzing the internal Verifier and Proposer services through their real processes
(hypothesis): random field values and corrupt bytes get a clean status (OK or
INVALID_ARGUMENT; never a crash, UNKNOWN/INTERNAL, or a stream that does not end), and the
service keeps serving afterwards."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos import common_pb2, proposer_pb2, proposer_pb2_grpc, verifier_pb2_grpc
from splitspec.launcher import grpc_healthy

pytestmark = pytest.mark.integration

CLEAN = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}
CALL_TIMEOUT_S = 60.0  # a stream that does not end within this is stuck
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

u32 = st.integers(0, 2**32 - 1)
i32 = st.integers(-2**31, 2**31 - 1)
floats = st.floats(allow_nan=True, allow_infinity=True)
small_text = st.text(max_size=40)


@st.composite
def sampling(draw) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(temperature=draw(floats), top_p=draw(floats),
                                    top_k=draw(i32), min_p=draw(floats))
    if draw(st.booleans()):
        msg.seed = draw(st.integers(0, 2**64 - 1))
    return msg


@st.composite
def generate_requests(draw) -> common_pb2.GenerateRequest:
    req = common_pb2.GenerateRequest(request_id=draw(small_text))
    prompt = draw(st.sampled_from(["none", "text", "ids"]))
    if prompt == "text":
        req.text = draw(small_text)
    elif prompt == "ids":
        req.token_ids.ids.extend(draw(st.lists(i32, max_size=20)))
    if draw(st.booleans()):
        req.sampling.CopyFrom(draw(sampling()))
    if draw(st.booleans()):
        req.stopping.CopyFrom(common_pb2.StoppingCriteria(
            max_tokens=draw(st.one_of(st.integers(0, 8), u32)),
            stop=draw(st.lists(small_text, max_size=3)),
            stop_token_ids=draw(st.lists(i32, max_size=3)), ignore_eos=draw(st.booleans())))
    req.speculation.mode = draw(st.integers(0, 6))  # unknown enum numbers included
    req.speculation.method = draw(st.sampled_from(["", "ngram", "draft", "nope"]))
    if draw(st.booleans()):
        req.speculation.num_speculative_tokens = draw(u32)
    if draw(st.booleans()):  # a gateway's plan, taken as it is but for this verifier's limits
        req.speculation_plan.CopyFrom(common_pb2.SpeculationPlan(
            method=draw(st.sampled_from(["", "ngram", "draft", "nope"])),
            k=draw(st.one_of(st.integers(0, 8), u32)), adaptive=draw(st.booleans()),
            k_min=draw(st.one_of(st.integers(0, 2), u32)), details=draw(st.booleans())))
    if draw(st.booleans()):
        req.resume.output_token_ids.extend(draw(st.lists(i32, max_size=10)))
        req.resume.sent_text_chars = draw(st.integers(0, 2**64 - 1))
    return req


@st.composite
def propose_requests(draw) -> proposer_pb2.ProposeRequest:
    msg = proposer_pb2.ProposeRequest(step_id=draw(st.integers(0, 2**64 - 1)),
                                      released=draw(st.lists(small_text, max_size=2)))
    for _ in range(draw(st.integers(0, 3))):
        step = msg.sequences.add(seq_id=draw(small_text),
                                 new_tokens=draw(st.lists(i32, max_size=12)),
                                 full_history=draw(st.booleans()),
                                 history_len=draw(st.one_of(st.integers(0, 24), u32)),
                                 k=draw(st.one_of(st.integers(0, 8), u32)))
        if draw(st.booleans()):
            step.sampling.CopyFrom(draw(sampling()))
        if draw(st.booleans()):
            step.hidden_state.CopyFrom(common_pb2.Tensor(
                shape=draw(st.lists(st.integers(-2, 64), max_size=3)),
                dtype=draw(st.sampled_from(["float32", "bfloat16", "int8", ""])),
                data=draw(st.binary(max_size=64))))
    return msg


def raw_stub(channel: grpc.Channel, method: str, streaming_request: bool):
    """A call that sends bytes as they are (no serializer): corrupt messages on the wire."""
    make = channel.stream_stream if streaming_request else channel.unary_stream
    return make(method, request_serializer=None, response_deserializer=None)


def code_of(call_result) -> grpc.StatusCode:
    try:
        list(call_result)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def still_serving(port: int) -> None:
    assert grpc_healthy(port), "the service stopped serving"


def test_verifier_generate_with_random_fields(stack):
    port = stack.verifier.port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = verifier_pb2_grpc.VerifierStub(ch)

        @FUZZ
        @given(generate_requests())
        def fuzz(req):
            code = code_of(stub.Generate(req, timeout=CALL_TIMEOUT_S))
            assert code in CLEAN, (code, req)

        fuzz()
    still_serving(port)


def test_verifier_and_proposer_with_corrupt_bytes(stack):
    targets = [(stack.verifier.port, "/splitspec.v1.Verifier/Generate", False),
               (stack.proposers["ngram"].port, "/splitspec.v1.Proposer/Propose", True)]
    for port, method, streaming in targets:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = raw_stub(ch, method, streaming)

            @FUZZ
            @given(st.lists(st.binary(max_size=200), min_size=1, max_size=3))
            def fuzz(payloads):
                if streaming:
                    result = call(iter(payloads), timeout=CALL_TIMEOUT_S)
                else:
                    result = call(payloads[0], timeout=CALL_TIMEOUT_S)
                code = code_of(result)
                assert code in CLEAN, (code, payloads)

            fuzz()
        still_serving(port)
    with grpc.insecure_channel(f"127.0.0.1:{stack.verifier.port}") as ch:
        call = raw_stub(ch, "/splitspec.v1.Verifier/Generate", False)
        with pytest.raises(grpc.RpcError) as err:
            list(call(b"\xff\xff\xff", timeout=CALL_TIMEOUT_S))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "request" in err.value.details()


def test_proposer_propose_with_random_fields(stack):
    port = stack.proposers["ngram"].port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = proposer_pb2_grpc.ProposerStub(ch)

        @FUZZ
        @given(st.lists(propose_requests(), min_size=1, max_size=3))
        def fuzz(messages):
            code = code_of(stub.Propose(iter(messages), timeout=CALL_TIMEOUT_S))
            assert code in CLEAN, (code, messages)

        fuzz()
    still_serving(port)
