"""The speculation policy through the real services: with `--speculative-disable-queue-size 2`
a burst of concurrent auto requests gets speculation only for the first two admitted, the rest
report `queue_size` in usage.speculation (also counted in /metrics); load the gateway did not
send itself reaches the policy through the verifier's WatchStats stream; once the queue drains
auto decides on goodput again."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import grpc
import httpx
import pytest
from polling import wait_until
from services_testlib import on_port, start_healthy
from stats_testlib import idle, watch_until

from protos import common_pb2, verifier_pb2_grpc
from splitspec.launcher import Service
from splitspec.net import free_port

pytestmark = pytest.mark.integration

BURST = 6
THRESHOLD = 2


@dataclass
class PolicyGateway:
    url: str
    metrics_url: str
    verifier_port: int


@pytest.fixture(scope="module")
def policy_gateway(stack, tmp_path_factory):
    """A second gateway in front of the package stack's verifier (8 running slots, the default),
    with the queue-size rule at THRESHOLD and the verifier's stats heard every 50 ms."""
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    argv = on_port(stack.gateway.argv, grpc_port, "--grpc-port", "--http-port", str(http_port))
    argv[argv.index("--metrics-port") + 1] = str(metrics_port)  # its own decision counters
    gateway = Service("gateway-policy", [
        *argv, "--speculative-disable-queue-size", str(THRESHOLD), "--stats-interval-ms", "50"],
        grpc_port, tmp_path_factory.mktemp("policy-logs") / "gateway.log")
    start_healthy(gateway, stack.config.startup_timeout_s)
    try:
        yield PolicyGateway(f"http://127.0.0.1:{http_port}",
                            f"http://127.0.0.1:{metrics_port}/metrics", stack.verifier.port)
    finally:
        gateway.stop()


def complete(client: httpx.Client, prompt: str, max_tokens: int) -> dict:
    r = client.post("/v1/completions", json={
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["speculation"]


def complete_if(client: httpx.Client, prompt: str, max_tokens: int, holds) -> dict | None:
    """complete()'s usage.speculation if holds(it), else None: a request to repeat until."""
    spec = complete(client, prompt, max_tokens)
    return spec if holds(spec) else None


def queue_size(spec: dict) -> bool:
    return spec["policy_reason"] == "queue_size"


def test_a_burst_turns_speculation_off_from_the_threshold_on(policy_gateway):
    watch_until(policy_gateway.verifier_port, idle)
    barrier = threading.Barrier(BURST)
    results: list[dict] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            with httpx.Client(base_url=policy_gateway.url, timeout=120) as client:
                barrier.wait()
                # long enough that every request of the burst is decided while all run
                results.append(complete(client, f"def f{i}(x):\n    return x + x\n", 96))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(BURST)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    assert all(r["mode"] == "auto" for r in results)
    off = [r for r in results if r["policy_reason"] == "queue_size"]
    admitted = [r for r in results if r["policy_reason"] != "queue_size"]
    assert len(off) == BURST - THRESHOLD, results
    assert all(r["method"] is None and r["num_speculative_tokens"] == 0
               and r["proposed_tokens"] == 0 for r in off)
    assert all(r["policy_reason"] in {"goodput", "low_acceptance", "compute_bound",
                                      "unmeasured_batch", "exploration"} for r in admitted), \
        admitted
    metrics = httpx.get(policy_gateway.metrics_url, timeout=10).text
    assert ('splitspec_policy_decisions_total{decision="off",method="none",'
            f'reason="queue_size"}} {float(BURST - THRESHOLD)}') in metrics


def test_load_sent_to_the_verifier_directly_reaches_the_policy_through_its_stats(policy_gateway):
    """Two generations the gateway never saw keep the verifier busy: only its stats stream can
    tell the gateway's policy that the queue is at the threshold."""
    port = policy_gateway.verifier_port
    watch_until(port, idle)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = verifier_pb2_grpc.VerifierStub(channel)
    calls = [stub.Generate(common_pb2.GenerateRequest(
        text=f"def held{i}(x):\n", stopping=common_pb2.StoppingCriteria(max_tokens=480,
                                                                      ignore_eos=True),
        sampling=common_pb2.SamplingParams(temperature=0)), timeout=120) for i in range(2)]
    try:
        for call in calls:
            next(call)  # first token: running
        watch_until(port, lambda s: s.running == 2)
        with httpx.Client(base_url=policy_gateway.url, timeout=60) as client:
            spec = wait_until(lambda: complete_if(client, "def h(z):\n", 2, queue_size), 30,
                              message="the policy to see the verifier's load")
        assert spec["method"] is None and spec["mode"] == "auto"
    finally:
        for call in calls:
            call.cancel()
        channel.close()


def test_once_the_burst_is_over_auto_decides_on_goodput_again(policy_gateway):
    watch_until(policy_gateway.verifier_port, idle)
    with httpx.Client(base_url=policy_gateway.url, timeout=60) as client:
        # the gateway hears the replica's stats every 50 ms: it learns the queue drained
        spec = wait_until(
            lambda: complete_if(client, "def g(y):\n", 4, lambda s: not queue_size(s)), 30,
            message="the gateway to see the queue drain")
    assert spec["mode"] == "auto" and spec["policy_reason"] != "queue_size"
