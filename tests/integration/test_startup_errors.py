"""A service started with a bad flag, model path, device or port prints one line naming it and
exits with status 2: no traceback (what an operator reads in `kubectl logs`)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from splitspec.launcher import REPO_ROOT, Stack
from splitspec.net import free_port

pytestmark = pytest.mark.integration


def start(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args, "--metrics-port", "0"],
                          cwd=REPO_ROOT, env=Stack.environment(), capture_output=True,
                          text=True, timeout=120)


def check_one_line(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    # the last line names the problem (gRPC core may log its own line before it)
    last = result.stderr.strip().splitlines()[-1]
    assert "error:" in last and all(w in last for w in words), last


@pytest.mark.parametrize("module,args,words", [
    ("verifier_service.server", ["--device", "mlu"], ["--device mlu"]),
    ("verifier_service.server", ["--model", "/nonexistent/model"],
     ["/nonexistent/model", "not a model directory"]),
    ("proposer_service.server", ["--method", "draft", "--model", "models/draft", "--device",
                                 "mlu"], ["--device mlu"]),
], ids=["verifier-device", "verifier-model", "proposer-device"])
def test_bad_device_model_or_dtype(module, args, words):
    check_one_line(start(module, "--port", str(free_port()), *args), *words)


def test_a_default_lookahead_shape_over_the_node_limit_is_refused_before_serving():
    """The verifier would serve, then refuse every request naming lookahead without a shape."""
    check_one_line(start("verifier_service.server", "--port", str(free_port()),
                         "--lookahead-window", "15", "--lookahead-ngram", "5",
                         "--max-num-speculative-tokens", "16"),
                   "--lookahead-window 15", "--max-num-speculative-tokens 16")


def test_a_broken_model_directory_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    check_one_line(start("verifier_service.server", "--port", str(free_port()), "--model",
                         str(tmp_path)), str(tmp_path), "cannot load")


def test_a_port_in_use_is_named():
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        check_one_line(start("proposer_service.server", "--method", "ngram", "--port",
                             str(port)), f"127.0.0.1:{port}")
