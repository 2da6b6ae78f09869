"""`splitspec serve` (what `make run` runs) and `splitspec up`: prints the gateway URL when
ready, serves a request, and SIGINT stops every service it started, leaving no process behind;
SIGKILL of the launcher takes its services down too. One run of the documented `make run` with
two verifier replicas checks all of the first at once (tests/splitspec/test_launcher_ports.py
checks the ports of every service)."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from polling import wait_until
from procs_testlib import alive, children_of, proposer_port_flags, stop_launcher

from splitspec.launcher import sibling_proposer_models
from splitspec.launcher.cli import build_parser
from splitspec.launcher.serve import up_namespace
from splitspec.launcher.service import grpc_healthy
from splitspec.launcher.stack import Stack
from splitspec.launcher.threads import THREADS_ENV
from splitspec.launcher.up import stack_config
from splitspec.methods import proposer_methods
from splitspec.net import bindable, free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def documented_args() -> str:
    """The ARGS of the `make run` example in docs/reliability.md."""
    (args,) = re.findall(r'make run ARGS="([^"]*)"', (ROOT / "docs/reliability.md").read_text())
    assert "--verifier-replicas 2" in args
    return args


def make_run(args: str) -> list[str]:
    """The command `make run MODEL=models/target ARGS=...` runs: the Makefile's `run` recipe,
    $(PY) this Python (the toy target: the suite never fetches the real model)."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    recipe = lines[next(i for i, line in enumerate(lines) if line.startswith("run:")) + 1]
    py, *argv = shlex.split(recipe.strip().replace("$(ARGS)", args)
                             .replace("$(MODEL)", "models/target"))
    assert py == "$(PY)", recipe
    return [sys.executable, *argv]


def threads_of(pid: int) -> int:
    """A process's OMP_NUM_THREADS, as it was started."""
    env = dict(v.split("=", 1) for v in
               (Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")) if "=" in v)
    return int(env[THREADS_ENV])


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_make_run_serves_every_service_and_sigint_stops_everything(tmp_path, monkeypatch):
    """The documented `make run ARGS="--verifier-replicas 2 ..."` (docs/reliability.md, the
    Makefile's comment), the command the Makefile's `run` recipe runs, on the default ports:
    it prints the gateway's URL when ready with a process for the gateway, both replicas, every
    model-free proposer and the learned ones shipped beside the model, every replica healthy;
    it serves a request; SIGINT stops it and every service it started. Each service runs the
    threads the launcher's plan gives it (its OMP_NUM_THREADS; the suite's own setting taken out
    of the launcher's environment). Where this machine already uses a default port, free ones
    are given instead (the rest is checked the same)."""
    argv = make_run(f"{documented_args()} --log-dir {tmp_path}")
    monkeypatch.delenv(THREADS_ENV, raising=False)

    def parsed(argv: list[str]) -> Stack:
        """The same flags, parsed in this process: every port the stack will take."""
        return Stack(stack_config(up_namespace(build_parser().parse_args(
            argv[argv.index("serve"):]))))

    stack = parsed(argv)
    ports = [stack.config.http_port, *(s.port for s in stack.services),
             *filter(None, stack.metrics_ports.values())]
    if any(not bindable(stack.config.host, p) for p in ports):
        argv += ["--port", str(free_port()), "--grpc-port", str(free_port()),
                 "--verifier-port", str(free_port()), "--metrics-port", "0",
                 *proposer_port_flags()]
        stack = parsed(argv)
        if busy := [s.port for s in stack.services if not bindable(stack.config.host, s.port)]:
            pytest.skip(f"ports in use on this machine, default and free alike: {busy}")
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        lines: list[str] = []

        def printed_url() -> bool:
            line = proc.stdout.readline()
            assert line, f"launcher exited early: {''.join(lines)}"
            lines.append(line)
            return stack.url in line

        wait_until(printed_url, 180, 0, "the launcher to print the gateway's URL")
        kids = children_of(proc.pid)
        model_free = [m for m, spec in proposer_methods().items()
                      if not spec.capabilities.needs_model]
        learned = [m for m in sibling_proposer_models(str(ROOT / "models/target"))
                   if m in proposer_methods()]  # in-target ones (an EAGLE head) start none
        assert learned  # the shipped draft and speculator sit beside the target
        assert len(stack.verifiers) == 2
        assert len(kids) == 1 + 2 + len(model_free) + len(learned), kids
        assert all(grpc_healthy(v.port) for v in stack.verifiers)
        assert sorted(threads_of(pid) for pid in kids) == sorted(stack.threads.values())
        r = httpx.post(f"{stack.url}/v1/completions", timeout=60,
                       json={"prompt": "def f(", "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
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

