"""A verifier that dies mid-stream is reported to the client as a clean error (never a hung
stream); the gateway keeps serving and reconnects within about a second when the verifier is
back."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest
from polling import wait_until

pytestmark = pytest.mark.integration
# Backoff cap 1 s, +20% jitter, plus room for a loaded 2-core machine.
RECONNECT_BOUND_S = 3.0


@pytest.fixture
def killable_stack(stack):
    """The package stack, its verifier running again after the test whatever happened."""
    try:
        yield stack
    finally:
        if not stack.verifier.alive():
            stack.restart(stack.verifier)


def test_verifier_death_mid_stream_ends_the_stream_with_an_error(killable_stack):
    body = {"prompt": "def f(x):\n", "max_tokens": 480, "temperature": 0, "stream": True,
            "ignore_eos": True}
    events = []
    t0 = time.monotonic()
    with httpx.Client(base_url=killable_stack.url, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line:
                    continue
                events.append(line)
                if len(events) == 3:
                    os.killpg(killable_stack.verifier.proc.pid, signal.SIGKILL)
        assert time.monotonic() - t0 < 30
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][len("data: "):])["error"]
        assert error["code"] == 503 and error["type"] == "server_error"

        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and "verifier" in r.json()["error"]["message"]
        assert client.get("/health").status_code == 503

        # Back on the same port: the gateway's channel retries at least once a second
        # (reconnect backoff capped at 1 s), so it serves again within about a second of the
        # verifier being healthy, not after gRPC's default backoff of up to two minutes.
        killable_stack.restart(killable_stack.verifier)
        wait_until(lambda: client.get("/health").status_code == 200, RECONNECT_BOUND_S, 0.05,
                   "the gateway to reconnect to the restarted verifier")
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
