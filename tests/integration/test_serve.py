"""`splitspec serve MODEL --speculative-config ...` as a vLLM user types it: the command starts
the stack the JSON asks for (the n-gram proposer only, k at most 5), the official `openai`
client gets answers with the key from SPLITSPEC_API_KEY (kept out of every process's command
line), and Ctrl-C stops it all and removes the key file. How its flags map onto the services' is
checked without processes in tests/splitspec/test_launcher_serve.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from polling import wait_until
from procs_testlib import alive, children_of, stop_launcher

from splitspec.net import free_port

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")]
ROOT = Path(__file__).resolve().parents[2]
KEY = "serve-test-key"


def test_serve_with_a_speculative_config_answers_the_openai_client(tiny_target_dir, tmp_path):
    port = free_port()
    argv = [sys.executable, "-m", "splitspec.launcher", "serve", tiny_target_dir,
            "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}',
            "--port", str(port), "--served-model-name", "tiny", "--device", "cpu",
            "--grpc-port", str(free_port()), "--verifier-port", str(free_port()),
            "--ngram-port", str(free_port()), "--metrics-port", "0",
            "--verifier-args", "--threads 1", "--log-dir", str(tmp_path)]
    proc = subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ, SPLITSPEC_API_KEY=KEY),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        lines: list[str] = []

        def printed_url() -> bool:
            line = proc.stdout.readline()
            assert line, f"serve exited early: {''.join(lines)}"
            lines.append(line)
            return url in line

        wait_until(printed_url, 180, 0, "serve to print the gateway's URL")
        kids = children_of(proc.pid)
        cmdlines = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in kids}
        assert len(kids) == 3, cmdlines  # gateway, verifier, the n-gram proposer only
        assert not any(KEY.encode() in arg for argv_ in cmdlines.values() for arg in argv_)
        (gateway,) = [a for a in cmdlines.values() if b"gateway.server" in a]
        key_file = Path(gateway[gateway.index(b"--api-key-file") + 1].decode())
        assert key_file.stat().st_mode & 0o777 == 0o600

        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)
        assert [m.id for m in client.models.list()] == ["tiny"]
        out = client.completions.create(
            model="tiny", prompt="one two three one two three one two", max_tokens=6,
            temperature=0, extra_body={"speculation": {"mode": "on", "method": "ngram"}})
        assert out.choices[0].text and out.usage.completion_tokens >= 1
        speculation = out.usage.model_extra["speculation"]
        assert speculation["method"] == "ngram", speculation
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        for pid in kids:
            wait_until(lambda: not alive(pid), 10, 0.1, f"service process {pid} to exit")
        assert not key_file.exists()
    finally:
        stop_launcher(proc)
