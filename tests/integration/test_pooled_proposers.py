"""Two n-gram proposer processes behind one `--proposer` name, as a proposer Deployment behind a
headless Service is in Kubernetes: the verifier spreads its sequences over both, and killing one
mid-generation fails no request and changes no output (greedy, so equal to speculation off)."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from learned_testlib import PROMPTS, GenClient
from services_testlib import start_healthy

from splitspec.launcher import Service
from splitspec.net import free_port, wait_for_port

pytestmark = [pytest.mark.integration, pytest.mark.soak]
MAX_TOKENS = 48
# No /metrics listeners (fixed default ports) in tests, where the services take the flag.
NO_METRICS = (["--metrics-port", "0"] if importlib.util.find_spec("splitspec.telemetry.config")
              else [])


def pool_stats(log_text: str, address: str) -> dict[str, int]:
    """The per-member counters the verifier's pool logs when it closes."""
    names = ("steps", "sequences", "full_histories", "moved_in", "missed")
    m = re.search(re.escape(address) + "".join(rf" {n}=(\d+)" for n in names), log_text)
    assert m, f"no pool stats for {address} in the verifier log"
    return dict(zip(names, map(int, m.groups())))


def test_two_proposers_behind_one_name_share_the_work_and_one_may_die(target_model_dir,
                                                                      tmp_path):
    py = sys.executable
    ports = [free_port(), free_port()]
    vport, http_port, grpc_port = free_port(), free_port(), free_port()
    proposers = [Service(f"proposer-ngram-{i}", [
        py, "-m", "proposer_service.server", "--method", "ngram", "--host", "127.0.0.1",
        "--port", str(p), *NO_METRICS], p, tmp_path / f"proposer-{i}.log")
        for i, p in enumerate(ports)]
    members = ",".join(f"127.0.0.1:{p}" for p in ports)
    verifier = Service("verifier", [
        py, "-m", "verifier_service.server", "--model", target_model_dir, "--device", "cpu",
        "--threads", "1", "--host", "127.0.0.1", "--port", str(vport),
        "--proposer", f"ngram={members}", "--proposer-timeout-ms", "2000",
        "--max-num-seqs", "8", *NO_METRICS], vport, tmp_path / "verifier.log")
    gateway = Service("gateway", [
        py, "-m", "gateway.server", "--host", "127.0.0.1", "--http-port", str(http_port),
        "--grpc-port", str(grpc_port), "--verifier", f"127.0.0.1:{vport}", *NO_METRICS],
        grpc_port,
        tmp_path / "gateway.log")
    services = [*proposers, verifier, gateway]
    client = None
    try:
        for svc in services:  # in order, each healthy before the next starts
            start_healthy(svc, 120)
        assert wait_for_port("127.0.0.1", http_port, 30)
        client = GenClient(grpc_port)
        base = client.generate_all([client.request(p, None, max_tokens=MAX_TOKENS)
                                    for p in PROMPTS])
        reqs = [client.request(p, "ngram", k=4, max_tokens=MAX_TOKENS) for p in PROMPTS]
        both = client.generate_all(reqs)
        assert [r.token_ids for r in both] == [b.token_ids for b in base]

        # Mid-generation, one member is killed outright.
        streaming = threading.Event()
        with ThreadPoolExecutor(len(reqs)) as pool:
            running = [pool.submit(client.generate, r, 120,
                                   lambda n: n >= 8 and streaming.set()) for r in reqs]
            assert streaming.wait(60)
            os.killpg(proposers[0].proc.pid, signal.SIGKILL)
            in_flight = sum(not f.done() for f in running)
            survived = [f.result() for f in running]  # raises if any request failed
        assert in_flight > 0
        assert [r.token_ids for r in survived] == [b.token_ids for b in base]
        assert all(len(r.token_ids) == MAX_TOKENS for r in survived)

        # The other member carries on alone: speculation still pays.
        after = client.generate_all(reqs)
        assert [r.token_ids for r in after] == [b.token_ids for b in base]
        assert sum(r.usage.speculation.accepted_tokens for r in after) > 0
    finally:
        if client is not None:
            client.close()
        for svc in reversed(services):
            svc.stop()
    log_text = verifier.log_path.read_text()
    dead, alive = (pool_stats(log_text, f"127.0.0.1:{p}") for p in ports)
    print(f"pool members: killed {dead}, survivor {alive}")
    # Both members had sequences before the kill; the killed one's running sequences moved to
    # the survivor (which heard each in full: the pool's full_histories count includes them).
    assert dead["steps"] > 0 and alive["steps"] > 0
    assert alive["moved_in"] > 0 and dead["moved_in"] == 0
