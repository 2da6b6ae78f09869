"""`splitspec up` supervises: a proposer or a verifier replica that dies is started again while
the rest keep serving (a dead proposer costs speculation only), `--verifier-replicas 2` puts
two verifiers behind the gateway, and `--verifier-args` reaches every verifier."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from polling import wait_until
from procs_testlib import alive, children_of, proposer_port_flags, stop_launcher

from splitspec.net import bindable, free_port

pytestmark = [pytest.mark.integration, pytest.mark.soak,
              pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")]
ROOT = Path(__file__).resolve().parents[2]


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def services(launcher: int) -> dict[str, list[int]]:
    """The launcher's live children by kind: gateway, verifier, proposer-METHOD."""
    out: dict[str, list[int]] = {}
    for pid in children_of(launcher):
        argv = cmdline(pid)
        if not alive(pid) or "-m" not in argv:
            continue
        module = argv[argv.index("-m") + 1]
        kind = {"gateway.server": "gateway", "verifier_service.server": "verifier"}.get(module)
        if module == "proposer_service.server":
            kind = "proposer-" + argv[argv.index("--method") + 1]
        if kind:
            out.setdefault(kind, []).append(pid)
    return out


def complete(url: str, **extra) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=60, json={
        "prompt": "def f(x):\n    return x\n\ndef f(", "max_tokens": 8, "temperature": 0,
        **extra})


NGRAM = {"speculation": {"mode": "on", "method": "ngram", "num_speculative_tokens": 3}}


def two_consecutive_free_ports(taken: list[str]) -> int:
    """A port p such that p and p + 1 are free and not among the ports handed out already."""
    while True:
        p = free_port()
        if str(p + 1) not in taken and bindable("127.0.0.1", p + 1):
            return p


def test_up_restarts_dead_services_while_the_rest_serve(target_model_dir, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proposer_ports = proposer_port_flags()
    grpc_port = str(free_port())
    verifier_port = two_consecutive_free_ports([*proposer_ports, grpc_port, str(port)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "splitspec.launcher", "up", "--model", target_model_dir,
         "--device", "cpu", "--no-draft", "--no-mlp", "--http-port", str(port),
         "--grpc-port", grpc_port, "--verifier-port", str(verifier_port),
         "--verifier-replicas", "2", "--verifier-args", "--threads 1 --max-waiting 3",
         "--metrics-port", "0", *proposer_ports, "--log-dir", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        while url not in (line := proc.stdout.readline()):
            assert line, f"launcher exited early: {''.join(lines)}"
            lines.append(line)
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        found = services(proc.pid)
        assert len(found["verifier"]) == 2 and len(found["gateway"]) == 1
        for pid in found["verifier"]:
            argv = cmdline(pid)
            assert argv[argv.index("--max-waiting") + 1] == "3"
        assert complete(url, **NGRAM).json()["usage"]["speculation"]["proposed_tokens"] > 0

        # a dead proposer: speculation pauses, requests go on, it is started again
        (ngram,) = found["proposer-ngram"]
        os.kill(ngram, signal.SIGKILL)
        r = complete(url, **NGRAM)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        wait_until(lambda: [p for p in services(proc.pid).get("proposer-ngram", [])
                            if p != ngram], 60, 0.2, "the proposer's restart")
        wait_until(lambda: complete(url, **NGRAM).json()["usage"]["speculation"]
                   ["proposed_tokens"] > 0, 60, 0.2, "speculation with the restarted proposer")

        # a dead verifier replica: the other serves, and it is started again
        victim = found["verifier"][0]
        os.kill(victim, signal.SIGKILL)
        for _ in range(4):
            assert complete(url).status_code == 200
        wait_until(lambda: len([p for p in services(proc.pid).get("verifier", [])
                                if p != victim]) == 2, 60, 0.2, "the verifier's restart")
        assert proc.poll() is None
        assert any("proposer-ngram exited" in line and "restarting" in line for line in lines)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        stop_launcher(proc)
