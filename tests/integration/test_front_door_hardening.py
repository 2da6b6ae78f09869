"""The gateway's front doors against hostile or broken clients, through the real processes:
out-of-range numbers, unparsable JSON and bad sampling fields (the verifier's vocabulary check
included) are 400s naming the field on a connection that stays usable, oversized and half-sent
requests are refused, prompts too long for the context are refused before anyone tokenizes
them, a client that leaves is aborted in the verifier, gRPC validates as REST does, health
agrees on both doors, unconnected proposers are not listed, and the optional API keys and
per-key concurrency limit hold."""

from __future__ import annotations

import json
import socket
import threading

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from services_testlib import on_port, start_healthy
from stats_testlib import current, idle, watch_until

from protos import common_pb2, generation_pb2_grpc, verifier_pb2_grpc
from splitspec.launcher import Service, Stack
from splitspec.methods import in_target_methods
from splitspec.net import free_port, wait_for_port

pytestmark = pytest.mark.integration

KEYS = ("key-a", "key-b")


def http_exchange(sock: socket.socket, body: bytes, path: str = "/v1/completions") -> tuple:
    """Send one request on an open keep-alive connection; (status, headers, JSON body)."""
    sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: t\r\nContent-Type: "
                 b"application/json\r\nContent-Length: " + str(len(body)).encode()
                 + b"\r\n\r\n" + body)
    return read_response(sock)


def read_response(sock: socket.socket) -> tuple:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(lines[0].split()[1]), headers, json.loads(rest[:length])


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    return sock


@pytest.mark.parametrize("raw, field", [
    (b'{"prompt": "x", "max_tokens": 99999999999999999999}', "max_tokens"),
    (b'{"prompt": [4294967296]}', "prompt"),
    (b'{"prompt": "x", "stop_token_ids": [18446744073709551616]}', "stop_token_ids"),
    (b'{"prompt": "x", "temperature": 1' + b"0" * 400 + b"}", "temperature"),
    (b'{"prompt": "x", "temperature": 0.' + b"1" * 400 + b"5e999}", "temperature"),
    (b'{"prompt": "x", "top_k": ' + b"9" * 5000 + b"}", "body"),
    (b'{"prompt": "x", "speculation": {"num_speculative_tokens": 4294967297}}',
     "speculation.num_speculative_tokens"),
    (b'{"prompt": "x", "seed": 18446744073709551616}', "seed"),
    (b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}", "body"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 1e400}',
     "max_completion_tokens"),
])
def test_out_of_range_numbers_are_a_400_on_a_connection_that_stays_usable(stack, raw, field):
    path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
    with connect(stack.config.http_port) as sock:
        status, _, body = http_exchange(sock, raw, path)
        assert status == 400, body
        assert body["error"]["param"] == field and body["error"]["message"].startswith(field)
        # the same connection serves the next request
        status, _, body = http_exchange(sock, json.dumps({
            "prompt": "x", "max_tokens": 2, "temperature": 0}).encode())
        assert status == 200 and body["usage"]["completion_tokens"] == 2


OUTSIDE_ANY_VOCAB = 10**9  # a token id in range for the wire, beyond the served vocabulary


@pytest.mark.parametrize("path, fields, field", [
    ("/v1/completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("/v1/chat/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {"logit_bias": {"five": 1}}, "logit_bias"),
    # in the declared range, outside the model's vocabulary: only the verifier can tell
    ("/v1/completions", {"logit_bias": {str(OUTSIDE_ANY_VOCAB): 1}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {str(OUTSIDE_ANY_VOCAB): 1}, "stream": True},
     "logit_bias"),
    ("/v1/completions", {"allowed_token_ids": [1, OUTSIDE_ANY_VOCAB]}, "allowed_token_ids"),
    ("/v1/completions", {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ("/v1/completions", {"max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ("/v1/completions", {"bad_words": ["fine", 7]}, "bad_words"),
])
def test_bad_sampling_fields_are_a_400_naming_them_and_the_next_request_is_served(
        stack, path, fields, field):
    body = {"prompt": "x"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "x"}]}
    with connect(stack.config.http_port) as sock:
        status, _, error = http_exchange(sock, json.dumps({**body, **fields}).encode(), path)
        assert status == 400, error
        assert error["error"]["param"] == field, error
        assert error["error"]["message"].startswith(f"{field}: ")
        status, _, ok = http_exchange(sock, json.dumps({
            "prompt": "x", "max_tokens": 2, "temperature": 0, "logit_bias": {"1": 1},
            "min_tokens": 2}).encode())
        assert status == 200 and ok["usage"]["completion_tokens"] == 2


def test_grpc_refuses_bad_sampling_fields_naming_them(stack):
    """The same fields at the public gRPC door: INVALID_ARGUMENT naming each, the gateway's own
    checks and the verifier's vocabulary check alike; then a good request is served."""
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}") as ch:
        stub = generation_pb2_grpc.GenerationStub(ch)
        for sampling, stopping, field in [
            (dict(presence_penalty=-2.5), None, "presence_penalty"),
            (dict(logit_bias={OUTSIDE_ANY_VOCAB: 1.0}), None, "logit_bias"),
            (dict(logit_bias={i: 1.0 for i in range(301)}), None, "logit_bias"),
            (dict(allowed_token_ids=[OUTSIDE_ANY_VOCAB]), None, "allowed_token_ids"),
            (dict(min_tokens=5), dict(max_tokens=4), "min_tokens"),
            (dict(bad_words=[""]), None, "bad_words"),
        ]:
            request = common_pb2.GenerateRequest(
                text="x", sampling=common_pb2.SamplingParams(temperature=1, **sampling),
                stopping=common_pb2.StoppingCriteria(**(stopping or {"max_tokens": 2})))
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Generate(request, timeout=60))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, e.value)
            assert e.value.details().startswith(f"{field}: "), e.value.details()
        ok = list(stub.Generate(common_pb2.GenerateRequest(
            text="x", sampling=common_pb2.SamplingParams(temperature=0, min_tokens=2,
                                                         logit_bias={1: 1.0}),
            stopping=common_pb2.StoppingCriteria(max_tokens=2)), timeout=60))
        assert ok[-1].usage.completion_tokens == 2


def test_a_prompt_too_long_for_the_context_is_refused_before_tokenizing(stack):
    """512 tokens of context: a 1 MB text cannot fit, and nobody spends time tokenizing it;
    the verifier refuses it too when asked directly (a 20 MB text)."""
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        r = client.post("/v1/completions", json={"prompt": "def f(x): " * 100_000})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = client.post("/v1/chat/completions", json={"messages": [
            {"role": "user", "content": "x" * 1_000_000}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    with grpc.insecure_channel(f"127.0.0.1:{stack.verifier.port}", options=[
            ("grpc.max_send_message_length", 64 << 20)]) as ch:
        with pytest.raises(grpc.RpcError) as e:
            list(verifier_pb2_grpc.VerifierStub(ch).Generate(
                common_pb2.GenerateRequest(text="x" * 20_000_000), timeout=60))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("prompt: ")


def test_a_request_body_over_the_limit_is_a_413(guarded):
    with httpx.Client(base_url=guarded.url, timeout=60, headers=auth("key-a")) as client:
        r = client.post("/v1/completions", json={"prompt": "x" * 10_000})
        assert r.status_code == 413 and r.json()["error"]["param"] == "body"
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 200


def test_a_half_sent_request_does_not_hold_its_connection(guarded):
    """Headers cut short: the connection is closed after --header-timeout-s. A body cut short:
    408 after --body-timeout-s."""
    with connect(guarded.http_port) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Le")
        assert sock.recv(1024) == b""  # closed by the server (the socket timeout is 60 s)
    with connect(guarded.http_port) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer key-a"
                     b"\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
        status, _, body = read_response(sock)
    assert status == 408 and body["error"]["param"] == "body"


def test_a_non_streamed_request_whose_client_left_is_aborted(stack):
    port = stack.verifier.port
    watch_until(port, idle)
    before = current(port).aborted_requests
    with connect(stack.config.http_port) as sock:
        body = json.dumps({"prompt": "def f(x):\n", "max_tokens": 480, "ignore_eos": True,
                           "temperature": 0}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        watch_until(port, lambda s: s.running == 1)
    stats = watch_until(port, lambda s: s.aborted_requests > before)
    assert stats.aborted_requests == before + 1
    watch_until(port, idle)


def test_grpc_generate_rejects_what_rest_rejects_naming_the_field(stack):
    with grpc.insecure_channel(f"127.0.0.1:{stack.config.grpc_port}") as ch:
        stub = generation_pb2_grpc.GenerationStub(ch)
        for request, field in [
            (common_pb2.GenerateRequest(text="x", sampling=common_pb2.SamplingParams(
                temperature=1, top_p=-0.5)), "top_p"),
            (common_pb2.GenerateRequest(text="x", sampling=common_pb2.SamplingParams(
                temperature=1, top_k=-5)), "top_k"),
            (common_pb2.GenerateRequest(text="x", speculation=common_pb2.SpeculationConfig(
                mode=7)), "speculation.mode"),
            (common_pb2.GenerateRequest(text="x" * 1_000_000), "prompt"),
            (common_pb2.GenerateRequest(token_ids=common_pb2.TokenIds(ids=[-3])), "prompt"),
            (common_pb2.GenerateRequest(text="x", options=common_pb2.GenerateOptions(
                top_logprobs=50)), "top_logprobs"),
        ]:
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Generate(request, timeout=60))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, e.value)
            assert e.value.details().startswith(f"{field}: ")
        corrupt = ch.unary_stream("/splitspec.v1.Generation/Generate")
        with pytest.raises(grpc.RpcError) as e:
            list(corrupt(b"\x0a\xff\xff\xff\xff\x0f", timeout=60))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        ok = list(stub.Generate(common_pb2.GenerateRequest(
            text="x", stopping=common_pb2.StoppingCriteria(max_tokens=2)), timeout=60))
        assert ok[-1].usage.completion_tokens == 2


def test_grpc_health_agrees_with_rest_health_when_no_verifier_is_reachable(stack, tmp_path):
    grpc_port, http_port = free_port(), free_port()
    gateway = Service("gateway-orphan", [
        *on_port(stack.gateway.argv, grpc_port, "--grpc-port", "--http-port", str(http_port),
                 "--verifier", f"127.0.0.1:{free_port()}")], grpc_port,
        tmp_path / "gateway-orphan.log")
    try:
        gateway.start(Stack.environment())
        assert wait_for_port("127.0.0.1", http_port, 60)
        assert httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=30).status_code == 503
        assert httpx.get(f"http://127.0.0.1:{http_port}/ready", timeout=30).status_code == 503
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                        timeout=30)
        assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        gateway.stop()


# -- a second verifier (its proposer never up) behind a gateway with every limit on -----------

class Guarded:
    def __init__(self, http_port: int, grpc_port: int):
        self.http_port, self.grpc_port = http_port, grpc_port
        self.url = f"http://127.0.0.1:{http_port}"


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def guarded(stack, tmp_path_factory):
    logs = tmp_path_factory.mktemp("guarded")
    keys = logs / "keys.txt"
    keys.write_text("# API keys\n" + "\n".join(KEYS) + "\n\n")
    v_port, grpc_port, http_port = free_port(), free_port(), free_port()
    argv = on_port(stack.verifier.argv, v_port)
    while "--proposer" in argv:  # its only proposer: an address nobody serves
        i = argv.index("--proposer")
        del argv[i:i + 2]
    verifier_argv = [*argv, "--proposer", f"ngram=127.0.0.1:{free_port()}"]
    verifier = Service("verifier-guarded", verifier_argv, v_port, logs / "verifier.log")
    gateway = Service("gateway-guarded", [
        *on_port(stack.gateway.argv, grpc_port, "--grpc-port", "--http-port", str(http_port),
                 "--verifier", f"127.0.0.1:{v_port}"),
        "--api-key-file", str(keys), "--max-body-bytes", "4096", "--max-concurrent-per-key", "1",
        "--header-timeout-s", "1", "--body-timeout-s", "1"], grpc_port, logs / "gateway.log")
    try:
        for svc in (verifier, gateway):
            start_healthy(svc, stack.config.startup_timeout_s)
        assert wait_for_port("127.0.0.1", http_port, 60)
        g = Guarded(http_port, grpc_port)
        g.verifier_port = v_port
        yield g
    finally:
        gateway.stop()
        verifier.stop()


def test_a_proposer_that_is_not_connected_is_not_listed(guarded):
    # only the methods that run inside the verifier and need no model (eagle needs its head)
    inside = [m for m, spec in in_target_methods().items() if not spec.capabilities.needs_model]
    models = httpx.get(guarded.url + "/v1/models", headers=auth("key-a"), timeout=30).json()
    assert models["data"][0]["speculation_methods"] == inside
    with grpc.insecure_channel(f"127.0.0.1:{guarded.grpc_port}") as ch:
        listed = generation_pb2_grpc.GenerationStub(ch).ListModels(
            common_pb2.Empty(), metadata=[("authorization", "Bearer key-b")], timeout=30)
    assert list(listed.models[0].speculation_methods) == inside


def test_api_keys_are_required_on_both_doors(guarded):
    openai = pytest.importorskip("openai")
    with httpx.Client(base_url=guarded.url, timeout=60) as client:
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 401 and r.json()["error"]["param"] == "authorization"
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2},
                        headers=auth("key-z"))
        assert r.status_code == 401
        assert client.get("/health").status_code == 200  # probes need no key
    oa = openai.OpenAI(base_url=guarded.url + "/v1", api_key="key-b", max_retries=0)
    # greedy: a sampled answer may end at its first token (EOS drawn), which says nothing here
    assert oa.completions.create(model=oa.models.list().data[0].id, prompt="x", max_tokens=2,
                                 temperature=0).usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=guarded.url + "/v1", api_key="nope", max_retries=0
                      ).models.list()
    with grpc.insecure_channel(f"127.0.0.1:{guarded.grpc_port}") as ch:
        stub = generation_pb2_grpc.GenerationStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(common_pb2.GenerateRequest(text="x"), timeout=30))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_concurrent_requests_per_key_are_limited(guarded):
    watch_until(guarded.verifier_port, idle)
    started, done = threading.Event(), threading.Event()
    with httpx.Client(base_url=guarded.url, timeout=120) as client:
        def hold():  # one long stream of key-a, read until the test is done with it
            with client.stream("POST", "/v1/completions", headers=auth("key-a"), json={
                    "prompt": "def f(x):\n", "max_tokens": 480, "ignore_eos": True,
                    "stream": True}) as r:
                for _ in r.iter_lines():
                    started.set()
                    if done.is_set():
                        break

        t = threading.Thread(target=hold, daemon=True)
        t.start()
        assert started.wait(60)
        try:
            r = client.post("/v1/completions", headers=auth("key-a"),
                            json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            with grpc.insecure_channel(f"127.0.0.1:{guarded.grpc_port}") as ch:
                with pytest.raises(grpc.RpcError) as e:  # one count for both doors
                    list(generation_pb2_grpc.GenerationStub(ch).Generate(
                        common_pb2.GenerateRequest(text="x"), timeout=30,
                        metadata=[("authorization", "Bearer key-a")]))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            r = client.post("/v1/completions", headers=auth("key-b"),
                            json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 200
        finally:
            done.set()
            t.join(60)
    watch_until(guarded.verifier_port, idle)
    r = httpx.post(guarded.url + "/v1/completions", headers=auth("key-a"), timeout=60,
                   json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 200  # the slot came back when the stream ended
