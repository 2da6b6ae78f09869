"""Property-based requests against a live gateway's two front doors: schemathesis over the
/openapi.json it serves (valid and invalid bodies for every route: no 5xx, and every 4xx that
is about the request names its field), and hypothesis-built GenerateRequests (the logits
processors' fields included) and raw bytes at the public gRPC Generate (only OK or a
documented status, INVALID_ARGUMENT naming the field). The gateway runs over its own verifier
with a 32-token context and at most 2 prompts per request, so that every generated request is
quick."""

from __future__ import annotations

import grpc
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from services_testlib import on_port, start_healthy

from protos import common_pb2, generation_pb2_grpc
from splitspec.launcher import Service
from splitspec.net import free_port, wait_for_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fuzzed_gateway(stack, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fuzz")
    v_port, grpc_port, http_port = free_port(), free_port(), free_port()
    verifier = Service("verifier-fuzz", [*on_port(stack.verifier.argv, v_port),
                                         "--max-model-len", "32", "--no-warmup"],
                       v_port, logs / "verifier.log")
    gateway = Service("gateway-fuzz", [
        *on_port(stack.gateway.argv, grpc_port, "--grpc-port", "--http-port", str(http_port),
                 "--verifier", f"127.0.0.1:{v_port}"), "--max-prompts", "2"],
        grpc_port, logs / "gateway.log")
    try:
        for svc in (verifier, gateway):
            start_healthy(svc, stack.config.startup_timeout_s)
        assert wait_for_port("127.0.0.1", http_port, 60)
        yield f"http://127.0.0.1:{http_port}", grpc_port
    finally:
        gateway.stop()
        verifier.stop()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors_and_4xx_name_the_field(fuzzed_gateway, mode):
    fuzzed_gateway, _ = fuzzed_gateway
    schema = schemathesis.openapi.from_url(fuzzed_gateway + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 5

    @given(st.sampled_from(operations).flatmap(lambda op: op.as_strategy(mode)))
    @settings(max_examples=60, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def check(case):
        response = case.call(base_url=fuzzed_gateway, timeout=60)
        assert response.status_code < 500, (case.method, case.path, case.body, response.text)
        if 400 <= response.status_code < 500 and response.status_code != 429:
            error = response.json()["error"]
            assert error["param"] and error["message"].startswith(error["param"]), \
                (case.method, case.path, case.body, error)

    check()


_I32 = st.integers(-(2**31), 2**31 - 1)
_FLOAT = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 0.5, 1.0, -0.5])
_TEXT = st.text(max_size=40)

# the logits processors' fields, in and out of their ranges
_PROCESSORS = st.fixed_dictionaries({}, optional={
    "presence_penalty": _FLOAT, "frequency_penalty": _FLOAT, "repetition_penalty": _FLOAT,
    "logit_bias": st.dictionaries(_I32, _FLOAT | st.floats(-100, 100), max_size=4),
    "min_tokens": st.integers(0, 48), "bad_words": st.lists(_TEXT, max_size=3),
    "allowed_token_ids": st.lists(_I32 | st.integers(0, 300), max_size=4)})

_REQUESTS = st.builds(
    lambda prompt, temperature, top_p, top_k, min_p, seed, max_tokens, stop, stop_ids, mode,
    method, k, top_logprobs, roles, processors: common_pb2.GenerateRequest(
        sampling=common_pb2.SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                                           min_p=min_p, seed=seed, **processors),
        stopping=common_pb2.StoppingCriteria(max_tokens=max_tokens, stop=stop,
                                             stop_token_ids=stop_ids),
        speculation=common_pb2.SpeculationConfig(mode=mode, method=method,
                                                 num_speculative_tokens=k),
        options=common_pb2.GenerateOptions(
            top_logprobs=top_logprobs,
            messages=[common_pb2.ChatMessage(role=r, content="x") for r in roles]),
        **({"text": prompt} if isinstance(prompt, str)
           else {"token_ids": common_pb2.TokenIds(ids=prompt)})),
    st.one_of(_TEXT, st.lists(_I32, max_size=8)), _FLOAT, _FLOAT, _I32, _FLOAT,
    st.none() | st.integers(0, 2**64 - 1), st.integers(0, 40), st.lists(_TEXT, max_size=3),
    st.lists(_I32, max_size=3), _I32, st.sampled_from(["", "ngram", "suffix", "nope"]),
    st.none() | st.integers(0, 2**32 - 1), st.none() | st.integers(0, 30),
    st.lists(st.sampled_from(["user", "system", "assistant", "tool"]), max_size=2),
    _PROCESSORS)

# what a client may see from Generate besides OK; INVALID_ARGUMENT must name the field
_DOCUMENTED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
               grpc.StatusCode.NOT_FOUND}


def test_grpc_generate_answers_any_request_with_a_documented_status(fuzzed_gateway):
    _, grpc_port = fuzzed_gateway
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
        stub = generation_pb2_grpc.GenerationStub(ch)
        raw = ch.unary_stream("/splitspec.v1.Generation/Generate")

        def outcome(call):
            try:
                list(call)
                return None
            except grpc.RpcError as exc:
                assert exc.code() in _DOCUMENTED, (exc.code(), exc.details())
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    field, sep, _ = exc.details().partition(": ")
                    assert sep and field and " " not in field, exc.details()
                return exc.code()

        @given(_REQUESTS, st.binary(max_size=64))
        @settings(max_examples=60, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(request, data):
            outcome(stub.Generate(request, timeout=60))
            outcome(raw(data, timeout=60))

        check()
