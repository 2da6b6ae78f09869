"""A stack whose verifier splits the toy target over two ranks (`--tensor-parallel-size 2`, gloo
on the CPU), through the official openai client: greedy output is identical with speculation
off and with each method on (chains, token trees, lookahead) and with a seeded sampled request
on and off; then rank 1 is killed (SIGKILL) while a stream runs: the stream ends with a clean
error (UNAVAILABLE: the gateway would resume it on another replica; this stack has none), never
a hang, and the verifier exits non-zero for its supervisor to restart the group."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import openai
import pytest
from polling import wait_until
from procs_testlib import children_of

from splitspec.launcher import Stack, StackConfig

pytestmark = pytest.mark.integration
PROMPT = "def add(a, b):\n    return a + b\n\ndef add("


@pytest.fixture(scope="module")
def tp_stack(target_model_dir, tmp_path_factory):
    config = StackConfig.with_free_ports(model=target_model_dir, device="cpu",
                                         log_dir=tmp_path_factory.mktemp("tp-logs"),
                                         methods=["ngram"], tensor_parallel_size=2,
                                         verifier_args=["--threads", "1"])
    with Stack(config) as s:
        yield s


@pytest.fixture(scope="module")
def oa(tp_stack):
    client = openai.OpenAI(base_url=f"{tp_stack.url}/v1", api_key="unused", max_retries=0)
    yield client
    client.close()


def _complete(oa, speculation: dict, **kw):
    return oa.completions.create(model="target", prompt=PROMPT, max_tokens=32,
                                 extra_body={"speculation": speculation}, **kw)


def test_speculation_on_and_off_are_identical_at_tp2(oa):
    off = _complete(oa, {"mode": "off"}, temperature=0).choices[0].text
    for spec in ({"mode": "on", "method": "ngram", "num_speculative_tokens": 4},
                 {"mode": "on", "method": "ngram", "num_speculative_tokens": 6,
                  "num_branches": 2},
                 {"mode": "on", "method": "lookahead", "num_speculative_tokens": 8}):
        out = _complete(oa, spec, temperature=0)
        assert out.choices[0].text == off, spec
        assert out.usage.model_extra["speculation"]["accepted_tokens"] > 0, spec
    seeded = [_complete(oa, spec, temperature=0.8, seed=7).choices[0].text
              for spec in ({"mode": "off"}, {"mode": "on", "method": "ngram"})]
    assert seeded[0] == seeded[1]


def _rank_processes(verifier_pid: int) -> list[int]:
    """The verifier's tensor-parallel ranks (its spawned children; not the resource tracker)."""
    return [pid for pid in children_of(verifier_pid)
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def test_a_killed_rank_ends_the_stream_cleanly_and_the_verifier_exits(tp_stack, oa):
    verifier = tp_stack.verifier.proc
    (rank1,) = _rank_processes(verifier.pid)
    stream = oa.completions.create(model="target", prompt=PROMPT, max_tokens=200, temperature=0,
                                   stream=True, extra_body={"speculation": {"mode": "off"}})
    started, text = time.monotonic(), ""
    with pytest.raises(openai.APIError, match="tensor-parallel rank"):
        for chunk in stream:
            text += chunk.choices[0].text if chunk.choices else ""
            if text and rank1:
                os.kill(rank1, signal.SIGKILL)
                rank1 = 0
    assert text and time.monotonic() - started < 60  # ended promptly, mid-stream
    wait_until(lambda: verifier.poll() is not None, 30, 0.2, "the verifier to exit")
    assert verifier.returncode == 1
