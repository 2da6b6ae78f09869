"""The documented `make run ARGS="--verifier-replicas 2 ..."` (docs/reliability.md, the
Makefile's comment) on the default ports: the command the Makefile's `run` recipe runs, with
the arguments the docs give, serves a request through the gateway with both replicas healthy,
and SIGINT stops it. The learned proposers are left out to keep it cheap (each is one more
process to start); tests/splitspec/test_launcher_ports.py checks the ports with all of them."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from procs_testlib import stop_launcher

from splitspec.launcher.cli import build_parser
from splitspec.launcher.service import grpc_healthy
from splitspec.launcher.stack import Stack
from splitspec.launcher.up import stack_config
from splitspec.net import bindable

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


def test_make_run_with_two_replicas_serves_on_the_default_ports(tmp_path):
    argv = make_run(f"{documented_args()} --no-draft --no-mlp --log-dir {tmp_path}")
    # the same flags, parsed in this process: every port the stack will take
    stack = Stack(stack_config(build_parser().parse_args(argv[argv.index("up"):])))
    ports = [stack.config.http_port, *(s.port for s in stack.services),
             *filter(None, stack.metrics_ports.values())]
    if busy := [p for p in ports if not bindable(stack.config.host, p)]:
        pytest.skip(f"default ports in use on this machine: {busy}")
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        lines: list[str] = []
        while stack.url not in (line := proc.stdout.readline()):
            assert line, f"launcher exited early: {''.join(lines)}"
            lines.append(line)
        assert len(stack.verifiers) == 2
        assert all(grpc_healthy(v.port) for v in stack.verifiers)
        r = httpx.post(f"{stack.url}/v1/completions", timeout=60,
                       json={"prompt": "def f(", "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        stop_launcher(proc)
