"""The 429 at the front door: when the verifier's queue is full (`--max-num-seqs` running and
`--max-waiting` queued), a new request gets HTTP 429 from the gateway's REST API and
RESOURCE_EXHAUSTED from its gRPC API, and the stack serves again once the queue drains."""

from __future__ import annotations

import json
import socket
import threading

import grpc
import httpx
import openai  # imported here, not while the queue is held full: the import takes a while
import pytest
from learned_testlib import GenClient
from stats_testlib import idle, watch_until

from splitspec.launcher import Stack, StackConfig

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def small_stack(target_model_dir, tmp_path_factory):
    config = StackConfig.with_free_ports(
        model=target_model_dir, device="cpu", log_dir=tmp_path_factory.mktemp("queue-logs"),
        # Plain (unpacked) matmuls: the slowest forward, so a held 480-token request outlasts
        # each test by seconds.
        verifier_args=["--threads", "1", "--max-num-seqs", "1", "--max-waiting", "1",
                       "--linear", "dense"])
    with Stack(config) as s:
        yield s


@pytest.fixture
def full_queue(small_stack):
    """One request running and one waiting: the verifier's queue is full until the test ends."""
    port = small_stack.verifier.port
    watch_until(port, idle)
    client = GenClient(small_stack.config.grpc_port)
    outcomes: list = []

    def hold(i: int) -> None:
        try:  # ~480 decode steps: still running when the test is done with it
            client.generate(client.request(f"def f{i}(x):\n", None, max_tokens=480), 120)
            outcomes.append("finished")
        except grpc.RpcError as exc:
            outcomes.append(exc.code())

    threads = [threading.Thread(target=hold, args=(i,), daemon=True) for i in range(2)]
    threads[0].start()
    watch_until(port, lambda s: s.running == 1)
    threads[1].start()
    watch_until(port, lambda s: s.running == 1 and s.waiting == 1)
    try:
        yield small_stack
        stats = watch_until(port, lambda s: True)
        assert stats.running == 1 and stats.waiting == 1, "the queue drained during the test"
    finally:
        client.close()  # cancels both held requests
        for t in threads:
            t.join(30)
    assert outcomes == [grpc.StatusCode.CANCELLED] * 2
    watch_until(port, idle)


def test_rest_gets_429_when_the_verifier_queue_is_full(full_queue):
    with httpx.Client(base_url=full_queue.url, timeout=60) as client:
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
        assert r.status_code == 429, r.text
        err = r.json()["error"]
        assert err["code"] == 429 and err["type"] == "rate_limit_error"
        assert "queue" in err["message"] and int(r.headers["retry-after"]) >= 1


def test_grpc_gets_resource_exhausted_when_the_verifier_queue_is_full(full_queue):
    client = GenClient(full_queue.config.grpc_port)
    try:
        with pytest.raises(grpc.RpcError) as err:
            client.generate(client.request("x", None, max_tokens=4), 60)
    finally:
        client.close()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
    assert "queue" in err.value.details()


def test_a_streamed_request_gets_http_429_with_retry_after(full_queue):
    """The queue is full before the first token: the streamed response's status says so (not a
    200 with an error event), so the openai client raises RateLimitError."""
    with httpx.Client(base_url=full_queue.url, timeout=60) as client:
        with client.stream("POST", "/v1/completions",
                           json={"prompt": "x", "max_tokens": 4, "stream": True}) as r:
            r.read()
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    error = r.json()["error"]
    assert error["code"] == 429 and error["type"] == "rate_limit_error"
    oa = openai.OpenAI(base_url=full_queue.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        list(oa.chat.completions.create(model=oa.models.list().data[0].id, stream=True,
                                        max_tokens=4,
                                        messages=[{"role": "user", "content": "x"}]))


def test_the_stack_serves_again_once_the_queue_drains(small_stack):
    watch_until(small_stack.verifier.port, idle)
    with httpx.Client(base_url=small_stack.url, timeout=60) as client:
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 4,
                                                 "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_a_streamed_request_whose_client_leaves_while_queued_is_aborted(small_stack):
    """No first token yet (it waits behind a running request), so no response has started:
    the client leaving still removes it from the verifier's queue."""
    port = small_stack.verifier.port
    watch_until(port, idle)
    client = GenClient(small_stack.config.grpc_port)
    holder = threading.Thread(target=lambda: _hold(client), daemon=True)
    holder.start()
    try:
        before = watch_until(port, lambda s: s.running == 1)
        body = json.dumps({"prompt": "x", "max_tokens": 4, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", small_stack.config.http_port), 60) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            watch_until(port, lambda s: s.waiting == 1)
        # gone from the queue while the long request is still running (not finished)
        after = watch_until(port, lambda s: s.waiting == 0)
        assert after.running == 1 and after.finished_requests == before.finished_requests
        assert after.aborted_requests == before.aborted_requests + 1
    finally:
        client.close()
        holder.join(30)
    watch_until(port, idle)


def _hold(client: GenClient) -> None:
    try:  # ~480 decode steps: still running when the test is done with it
        client.generate(client.request("def f(x):\n", None, max_tokens=480), 120)
    except grpc.RpcError:
        pass
