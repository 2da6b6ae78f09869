"""The gateway's own bound (--max-pending): beyond that many requests in flight, a new one gets
HTTP 429 / RESOURCE_EXHAUSTED with Retry-After at once (nothing is queued without bound), and
the gateway serves again as soon as one ends."""

from __future__ import annotations

import threading

import grpc
import httpx
import pytest
from learned_testlib import GenClient
from polling import wait_until
from services_testlib import on_port, start_healthy

from splitspec.launcher import Service
from splitspec.net import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def bounded_gateway(stack, tmp_path):
    """A second gateway in front of the stack's verifier that admits 2 requests at a time."""
    grpc_port, http_port = free_port(), free_port()
    gateway = Service("gateway-bounded", [
        *on_port(stack.gateway.argv, grpc_port, "--grpc-port", "--http-port", str(http_port)),
        "--max-pending", "2"], grpc_port, tmp_path / "gateway-bounded.log")
    start_healthy(gateway, stack.config.startup_timeout_s)
    try:
        yield grpc_port, f"http://127.0.0.1:{http_port}"
    finally:
        gateway.stop()


def test_beyond_max_pending_requests_get_429_with_retry_after(bounded_gateway):
    grpc_port, url = bounded_gateway
    client = GenClient(grpc_port)
    started = [threading.Event(), threading.Event()]
    outcomes: list = []

    def hold(i: int) -> None:
        try:
            client.generate(client.request(f"def g{i}(x):\n", None, max_tokens=480), 120,
                            lambda n: started[i].set())
            outcomes.append("finished")
        except grpc.RpcError as exc:
            outcomes.append(exc.code())

    threads = [threading.Thread(target=hold, args=(i,), daemon=True) for i in range(2)]
    try:
        for t, ev in zip(threads, started):
            t.start()
            assert ev.wait(60)
        with httpx.Client(base_url=url, timeout=60) as http:
            r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert r.status_code == 429, r.text
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
            assert "max-pending" in r.json()["error"]["message"]
        with pytest.raises(grpc.RpcError) as err:
            client.generate(client.request("x", None, max_tokens=2), 60)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ("retry-after", "1") in tuple(err.value.trailing_metadata())
        assert "finished" not in outcomes  # both were still holding their places
    finally:
        client.close()  # cancels the held requests
        for t in threads:
            t.join(30)
    assert outcomes == [grpc.StatusCode.CANCELLED] * 2
    with httpx.Client(base_url=url, timeout=60) as http:  # places free again once noticed
        def admitted() -> httpx.Response | None:
            r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            return r if r.status_code != 429 else None

        r = wait_until(admitted, 30, 0.1, "the gateway to free the held places")
        assert r.status_code == 200
