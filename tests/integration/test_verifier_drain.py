"""SIGTERM on a verifier drains it: its health turns NOT_SERVING, the gateway routes new requests
to the other replica, the requests in flight finish there, and it exits; what is still running
when the grace period (--shutdown-grace-s) ends is handed back and resumed on the other replica
with the same output."""

from __future__ import annotations

import signal

import grpc
import pytest
from polling import wait_until
from replicas_testlib import StatsFollower, ensure_all_serving, run_in_flight
from stats_testlib import current, idle, watch_until

from splitspec.launcher import grpc_healthy

pytestmark = [pytest.mark.integration, pytest.mark.soak]

PROMPTS = ["def f(x):\n", "class A:\n    def", "import os\n", "for i in range("]
LONG = 400  # tokens of the requests in flight when A gets SIGTERM


def ok(results) -> None:
    for r in results:
        assert not isinstance(r, grpc.RpcError), f"a request failed: {r.code()} {r.details()}"


def test_sigterm_lets_requests_in_flight_finish_and_routes_new_ones_elsewhere(
        replicas, replica_client):
    client = replica_client
    a, b = replicas.verifiers
    # long enough that A still runs some when the last of them has started, on a loaded machine
    reqs = [client.request(p, None, max_tokens=LONG) for p in PROMPTS]
    before_a, before_b = current(a.port), current(b.port)
    drained: dict = {}
    new_results: list = []

    def drain_a_and_send_more():
        # what A runs when it gets SIGTERM: the follower's first stats (one of A's requests
        # may already have finished on a slow machine, while another was still starting)
        follower = StatsFollower(a.port)
        on_a = follower.first.running
        assert on_a > 0
        a.proc.send_signal(signal.SIGTERM)

        def not_serving() -> bool:
            assert a.proc.poll() is None, "it exited without draining"
            return not grpc_healthy(a.port)

        # health first: NOT_SERVING while the requests in flight still run
        wait_until(not_serving, 30, 0, "the draining verifier's health to turn NOT_SERVING")
        assert follower.last.running > 0
        new_results.extend(client.generate_all(
            [client.request(f"x{i} = ", None, max_tokens=4) for i in range(4)]))
        drained.update(code=a.proc.wait(60), on_a=on_a, last=follower.ended(30),
                       first=follower.first)

    results = run_in_flight(client, reqs, 4, drain_a_and_send_more)
    ok(results)
    assert all(len(r.token_ids) == LONG for r in results)
    assert [len(r.token_ids) for r in new_results] == [4] * 4
    assert drained["code"] == 0
    # A finished exactly the requests it had when it got SIGTERM, and was sent nothing new
    last, first = drained["last"], drained["first"]
    assert last.finished_requests - first.finished_requests == drained["on_a"]
    assert last.aborted_requests == first.aborted_requests
    assert last.kv_blocks_free == last.kv_blocks_total
    # every request finished once: the first ones on A or B, the four sent later on B only
    after_b = watch_until(b.port, idle)
    on_a_in_all = last.finished_requests - before_a.finished_requests
    assert after_b.finished_requests - before_b.finished_requests == len(reqs) - on_a_in_all + 4


def test_requests_still_running_when_the_grace_period_ends_resume_elsewhere(
        replicas, replica_client):
    client = replica_client
    a, b = replicas.verifiers
    reqs = [client.request(p, "ngram" if i % 2 else None, k=3, max_tokens=200, temperature=0.8,
                           seed=7 + i) for i, p in enumerate(PROMPTS[:2])]
    refs = client.generate_all(reqs)
    argv = a.argv
    a.argv = [*argv, "--shutdown-grace-s", "0.2"]  # the last one given wins
    try:
        replicas.restart(a)
        ensure_all_serving(replicas, client)
    finally:
        a.argv = argv
    before_a, before_b = current(a.port), current(b.port)
    follower: list[StatsFollower] = []

    def short_drain_of_a():
        follower.append(StatsFollower(a.port))
        assert follower[0].first.running > 0
        a.proc.send_signal(signal.SIGTERM)
        assert a.proc.wait(60) == 0

    results = run_in_flight(client, reqs, 4, short_drain_of_a)
    ok(results)
    for r, ref in zip(results, refs):
        assert (r.token_ids, r.text, r.usage.completion_tokens) == \
            (ref.token_ids, ref.text, ref.usage.completion_tokens)
    # what A did not finish (on a loaded machine it may finish one before the end), B did
    finished_on_a = follower[0].ended(30).finished_requests - before_a.finished_requests
    after_b = watch_until(b.port, idle)
    assert after_b.finished_requests - before_b.finished_requests == len(reqs) - finished_on_a
