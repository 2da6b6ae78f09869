"""Routing over verifier replicas: an unavailable replica is tried and skipped before the first
token, and a gateway over two real verifiers sends new requests to the less loaded one."""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures

import grpc
import pytest
from learned_testlib import GenClient
from services_testlib import on_port, start_healthy
from stats_testlib import current, idle, watch_until

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


def test_a_gateway_over_two_replicas_routes_to_the_less_loaded_one(stack, tmp_path):
    """One long request keeps one replica busy; every request after it goes to the other one.
    (Round robin alone would send half of them to the busy replica.)"""
    port_b = free_port()
    verifier_b = Service("verifier-b", on_port(stack.verifier.argv, port_b), port_b,
                         tmp_path / "verifier-b.log")
    grpc_port, http_port = free_port(), free_port()
    c = stack.config
    gateway = Service("gateway-2", [
        *on_port(stack.gateway.argv, grpc_port, "--grpc-port", "--http-port", str(http_port)),
        "--verifier", f"{c.host}:{port_b}"], grpc_port, tmp_path / "gateway-2.log")
    client = None
    try:
        for svc in (verifier_b, gateway):
            start_healthy(svc, c.startup_timeout_s)
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
        verifier_b.stop()
