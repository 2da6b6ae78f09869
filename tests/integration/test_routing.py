"""Routing over verifier replicas: an unavailable replica is tried and skipped before the first
token, a gateway over two real verifiers sends new requests to the less loaded one, and the turns
of one conversation go to the replica that has its prefix, until that replica drains (then to
the other one)."""

from __future__ import annotations

import asyncio
import signal
import threading
from concurrent import futures

import grpc
import planted_bugs as bug
import pytest
from learned_testlib import GenClient
from polling import wait_until
from services_testlib import on_port, start_healthy
from stats_testlib import current, idle, watch_until

from gateway.prefix_index import FALLBACK, PREFIX_HIT
from gateway.verifier_pool import VerifierPool
from protos import common_pb2, verifier_pb2_grpc
from splitspec.launcher import Service
from splitspec.net import free_port

pytestmark = pytest.mark.integration


class DeadVerifier(verifier_pb2_grpc.VerifierServicer):
    """A replica that is up as a process but cannot serve: every call is UNAVAILABLE. Records
    the requests routed to it."""

    def __init__(self):
        self.generate_calls: list[str] = []
        self.info_calls = 0

    def Generate(self, request, context):
        self.generate_calls.append(request.request_id)
        context.abort(grpc.StatusCode.UNAVAILABLE, "replica is down")

    def Info(self, request, context):
        self.info_calls += 1
        context.abort(grpc.StatusCode.UNAVAILABLE, "replica is down")


def test_requests_fail_over_from_an_unavailable_replica(stack):
    dead = DeadVerifier()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    verifier_pb2_grpc.add_VerifierServicer_to_server(dead, server)
    dead_port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    async def scenario():
        pool = VerifierPool((f"127.0.0.1:{dead_port}", f"127.0.0.1:{stack.verifier.port}"))
        try:
            info = await pool.info()
            assert info.model and info.vocab_size > 0
            req = common_pb2.GenerateRequest(
                text="def f(x):", sampling=common_pb2.SamplingParams(temperature=0),
                stopping=common_pb2.StoppingCriteria(max_tokens=3))
            for i in range(4):  # the rotation starts on the dead replica for some of them
                req.request_id = f"route-{i}"
                chunks = [m async for m in pool.generate(req)]
                assert chunks[-1].usage.completion_tokens == 3
            assert [r.in_flight for r in pool.replicas] == [0, 0]
            assert await pool.healthy()
        finally:
            await pool.close()

    try:
        asyncio.run(scenario())
    finally:
        server.stop(0)
    # The dead replica really was tried (and every request it refused still completed).
    assert dead.generate_calls and set(dead.generate_calls) <= {f"route-{i}" for i in range(4)}


@pytest.fixture(scope="module")
def verifier_b(stack, tmp_path_factory):
    """A second verifier replica beside the stack's own (the last test here drains it)."""
    port_b = free_port()
    svc = Service("verifier-b", on_port(stack.verifier.argv, port_b), port_b,
                  tmp_path_factory.mktemp("verifier-b") / "verifier-b.log")
    try:
        start_healthy(svc, stack.config.startup_timeout_s)
        yield svc
    finally:
        svc.stop()


def test_a_gateway_over_two_replicas_routes_to_the_less_loaded_one(stack, verifier_b, tmp_path):
    """One long request keeps one replica busy; every request after it goes to the other one.
    (Round robin alone would send half of them to the busy replica.)"""
    port_b = verifier_b.port
    grpc_port, http_port = free_port(), free_port()
    c = stack.config
    gateway = Service("gateway-2", [
        *on_port(stack.gateway.argv, grpc_port, "--grpc-port", "--http-port", str(http_port)),
        "--verifier", f"{c.host}:{port_b}"], grpc_port, tmp_path / "gateway-2.log")
    client = None
    try:
        start_healthy(gateway, c.startup_timeout_s)
        ports = {"a": c.verifier_port, "b": port_b}
        for port in ports.values():
            watch_until(port, idle)
        client = GenClient(grpc_port)
        long_req = client.request("x", None, max_tokens=480)
        first_chunk = threading.Event()
        result: dict = {}

        def run_long():
            try:
                result["long"] = client.generate(long_req, 120, lambda n: first_chunk.set())
            except grpc.RpcError as exc:
                result["long"] = exc.code()

        long_thread = threading.Thread(target=run_long, daemon=True)
        long_thread.start()
        assert first_chunk.wait(60)
        busy = next(name for name, port in ports.items() if current(port).running == 1)
        other = "b" if busy == "a" else "a"
        before = {name: current(port) for name, port in ports.items()}
        for i in range(4):
            short = client.generate(client.request(f"def f{i}(", None, max_tokens=4))
            assert len(short.token_ids) == 4
        after = {name: current(port) for name, port in ports.items()}
        assert "long" not in result and after[busy].running == 1, "the long request ended early"
        assert after[other].finished_requests - before[other].finished_requests == 4
        assert after[busy].finished_requests == before[busy].finished_requests
    finally:
        if client is not None:
            client.close()
        gateway.stop()


SYSTEM = ("You are a careful assistant. You answer questions about Python programs in one or "
          "two short sentences, and you show code only when it is asked for.")
QUESTIONS = ["What does zip do?", "And enumerate?", "Which one is lazy?", "Thanks. And map?"]


def turn(history: list[tuple[str, str]], i: int) -> common_pb2.GenerateRequest:
    return common_pb2.GenerateRequest(
        request_id=f"conversation-{i}", options=common_pb2.GenerateOptions(messages=[
            common_pb2.ChatMessage(role=r, content=c) for r, c in history]),
        sampling=common_pb2.SamplingParams(temperature=0),
        stopping=common_pb2.StoppingCriteria(max_tokens=4, ignore_eos=True))


def finished(ports: dict[str, int]) -> dict[str, int]:
    return {name: watch_until(port, idle).finished_requests for name, port in ports.items()}


async def converse(pool: VerifierPool, ports: dict[str, int], turns: int,
                   history: list[tuple[str, str]]) -> list[str]:
    """Send `turns` turns of one conversation, one after another (each with the answers so
    far), through the pool; the replica each one finished on."""
    went = []
    for i in range(turns):
        history.append(("user", QUESTIONS[len(history) // 2 % len(QUESTIONS)]))
        before = finished(ports)
        answer = "".join([m.text async for m in pool.generate(turn(history, i))])
        history.append(("assistant", answer))
        after = finished(ports)
        (name,) = [n for n in ports if after[n] > before[n]]
        went.append(name)
    return went


def check_a_conversation_stays_on_one_replica(stack, verifier_b) -> None:
    ports = {"b": verifier_b.port, "a": stack.config.verifier_port}

    async def scenario():
        # b first: with both idle, the first turn goes to the first replica listed
        pool = VerifierPool(tuple(f"127.0.0.1:{p}" for p in ports.values()))
        try:
            went = await converse(pool, ports, 3, [("system", SYSTEM)])
            # (least requests in flight alone alternates between two idle replicas)
            assert went == ["b"] * 3, f"the turns went to {went}"
            assert pool.routing_decisions[PREFIX_HIT] == 2
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_the_turns_of_a_conversation_land_on_one_replica(stack, verifier_b):
    check_a_conversation_stays_on_one_replica(stack, verifier_b)


def test_the_check_catches_a_gateway_that_ignores_prefixes(stack, verifier_b, monkeypatch):
    bug.prefix_routing_ignored(monkeypatch)
    with pytest.raises(AssertionError, match="the turns went to"):
        check_a_conversation_stays_on_one_replica(stack, verifier_b)


def test_a_draining_replicas_conversations_fall_back_to_the_other(stack, verifier_b):
    """The replica that has the conversation drains (SIGTERM) and exits: the next turn goes to
    the other one, counted as a fallback, and the turn after it stays there."""
    ports = {"b": verifier_b.port, "a": stack.config.verifier_port}

    async def scenario():
        pool = VerifierPool(tuple(f"127.0.0.1:{p}" for p in ports.values()))
        try:
            history = [("system", SYSTEM)]
            assert await converse(pool, ports, 2, history) == ["b", "b"]
            verifier_b.proc.send_signal(signal.SIGTERM)
            b = pool.replicas[0]
            await asyncio.to_thread(wait_until, lambda: not b.serving, 30, 0.05,
                                    "the pool to see b not serving")
            del ports["b"]
            assert await converse(pool, ports, 2, history) == ["a", "a"]
            assert pool.routing_decisions[FALLBACK] == 1
            assert pool.routing_decisions[PREFIX_HIT] == 2  # b's second turn, a's second turn
            assert len(pool.indexes[b]) == 0  # what b was sent is forgotten
        finally:
            await pool.close()

    try:
        asyncio.run(scenario())
    finally:
        assert verifier_b.proc.wait(60) == 0
