"""`splitspec up` (what `make run` runs): prints the gateway URL when ready, serves a request,
and SIGINT stops every service it started, leaving no process behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from polling import wait_until
from procs_testlib import alive, children_of, proposer_port_flags, stop_launcher

from splitspec.launcher import sibling_proposer_models
from splitspec.methods import proposer_methods
from splitspec.net import free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_up_serves_and_sigint_stops_everything(target_model_dir, tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "splitspec.launcher", "up", "--model", target_model_dir,
         "--device", "cpu", "--http-port", str(port), "--grpc-port", str(free_port()),
         "--verifier-port", str(free_port()), *proposer_port_flags(),
         "--log-dir", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []

        def printed_url() -> bool:
            line = proc.stdout.readline()
            assert line, f"launcher exited early: {''.join(lines)}"
            lines.append(line)
            return f"http://127.0.0.1:{port}" in line

        wait_until(printed_url, 180, 0, "the launcher to print the gateway's URL")
        kids = children_of(proc.pid)
        # gateway, verifier, the model-free proposers, plus the learned ones shipped beside the
        # model
        model_free = [m for m, spec in proposer_methods().items()
                      if not spec.capabilities.needs_model]
        learned = [m for m in sibling_proposer_models(target_model_dir)
                   if m in proposer_methods()]  # in-target ones (an EAGLE head) start none
        assert len(kids) == 2 + len(model_free) + len(learned), kids
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                       json={"prompt": "def f(", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        for pid in kids:
            wait_until(lambda: not alive(pid), 10, 0.1, f"service process {pid} to exit on SIGINT")
    finally:
        stop_launcher(proc)


@pytest.mark.soak
def test_services_do_not_outlive_a_killed_launcher(target_model_dir, tmp_path):
    """Even SIGKILL of `splitspec up` (no chance to clean up) takes the services down."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "splitspec.launcher", "up", "--model", target_model_dir,
         "--device", "cpu", "--no-draft", "--no-mlp", "--http-port", str(port),
         "--grpc-port", str(free_port()), "--verifier-port", str(free_port()),
         *proposer_port_flags(), "--log-dir", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kids: list[int] = []
    try:
        while f"http://127.0.0.1:{port}" not in (line := proc.stdout.readline()):
            assert line, "launcher exited early"
        kids = children_of(proc.pid)
        model_free = [m for m, spec in proposer_methods().items()
                      if not spec.capabilities.needs_model]
        assert len(kids) == 2 + len(model_free), kids  # gateway, verifier, model-free proposers
    finally:
        proc.kill()
        proc.wait()
    for pid in kids:
        wait_until(lambda: not alive(pid), 15, 0.1,
                   f"service process {pid} to exit with its launcher")

