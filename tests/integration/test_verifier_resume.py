"""A stream survives the death of the verifier serving it: the gateway resumes it on another
replica from the output the client already has, and the client sees one uninterrupted stream
whose tokens, text and usage are those of an undisturbed run (greedy and seeded sampled);
unseeded sampled streams resume with a valid sample.

Two replicas behind one gateway (the `replicas` fixture). To put every stream on one replica,
the other one is down when they start; it comes back after the first one is killed (the
gateway's --resume-wait-s lets the streams wait for it), so all of them must resume there."""

from __future__ import annotations

import json

import grpc
import httpx
import pytest
from learned_testlib import GenClient
from replicas_testlib import kill, run_in_flight
from stats_testlib import current, idle, watch_until

from protos import common_pb2
from splitspec.launcher import Stack
from splitspec.modelio import load_tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.soak]

PROMPTS = ["def f(x):\n", "class A:\n    def", "import os\n", "for i in range(",
           "# add two numbers\n", "x = [", "while True:\n", "if __name__ =="]


def kill_and_resume_elsewhere(stack: Stack, client: GenClient,
                              reqs: list[common_pb2.GenerateRequest]):
    """Every request streaming on replica A (B down), A killed, B started: their results and
    how many were cut and resumed on B (on a loaded machine a request can finish on A while a
    later one is still starting: it is not resumed)."""
    a, b = stack.verifiers
    kill(b)
    before_a = current(a.port)
    on_a: list = []

    def kill_a_start_b():
        on_a.append(current(a.port))
        kill(a)
        b.start(Stack.environment())

    results = run_in_flight(client, reqs, 6, kill_a_start_b)
    for r in results:
        assert not isinstance(r, grpc.RpcError), f"a stream failed: {r.code()} {r.details()}"
    # every request went to A: running there when it was killed, or already finished
    assert on_a[0].running + on_a[0].finished_requests - before_a.finished_requests == len(reqs)
    resumed = watch_until(b.port, idle).finished_requests  # B started afresh: all resumed
    assert 1 <= resumed <= on_a[0].running
    return results, resumed


def resumes(stack: Stack) -> float:
    text = httpx.get(stack.metrics_urls["gateway"], timeout=30).text
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("splitspec_gateway_stream_resumes_total"))


def check_same(results, refs) -> None:
    for r, ref in zip(results, refs):
        assert r.token_ids == ref.token_ids
        assert r.text == ref.text
        assert r.finish_reason == ref.finish_reason
        assert r.usage.completion_tokens == ref.usage.completion_tokens == len(ref.token_ids)
        assert r.usage.prompt_tokens == ref.usage.prompt_tokens


def test_killing_the_verifier_of_8_greedy_streams_leaves_their_output_unchanged(replicas,
                                                                                 replica_client):
    client = replica_client
    reqs = [client.request(p, "ngram" if i % 2 else None, k=3, max_tokens=72)
            for i, p in enumerate(PROMPTS)]
    refs = client.generate_all(reqs)
    before = resumes(replicas)
    results, resumed = kill_and_resume_elsewhere(replicas, client, reqs)
    check_same(results, refs)
    assert resumes(replicas) - before == resumed  # operators see them: a gateway counter


def test_killing_the_verifier_of_8_seeded_streams_leaves_their_output_unchanged(
        replicas, replica_client, target_model_dir):
    client = replica_client
    reqs = [client.request(p, "ngram" if i % 2 else None, k=3, max_tokens=72,
                           temperature=0.8, top_p=0.95, seed=1000 + i)
            for i, p in enumerate(PROMPTS[:6])]
    unseeded = [client.request(p, None, max_tokens=72, temperature=0.8)
                for p in PROMPTS[6:]]
    refs = client.generate_all(reqs)
    results, _ = kill_and_resume_elsewhere(replicas, client, reqs + unseeded)
    check_same(results[:6], refs)
    tok = load_tokenizer(target_model_dir)
    for r in results[6:]:  # a valid sample: full length, text that decodes from its tokens
        assert len(r.token_ids) == r.usage.completion_tokens == 72
        assert r.text and tok.decode(r.token_ids, skip_special_tokens=True).startswith(r.text)


def test_a_resumed_rest_stream_is_one_uninterrupted_response(replicas, replica_client):
    """Through the OpenAI-compatible REST API: one SSE response, no error event, the text and
    usage of the undisturbed run."""
    a, b = replicas.verifiers
    # Long enough that it is still streaming when A dies four events in.
    body = {"prompt": "def walk(tree):\n", "max_tokens": 256, "temperature": 0,
            "ignore_eos": True, "speculation": {"mode": "on", "method": "ngram"}}
    with httpx.Client(base_url=replicas.url, timeout=120) as http:
        ref = http.post("/v1/completions", json=body).json()
        before = resumes(replicas)
        kill(b)
        events = []
        with http.stream("POST", "/v1/completions", json={
                **body, "stream": True, "stream_options": {"include_usage": True}}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line:
                    continue
                events.append(line)
                if len(events) == 4:
                    kill(a)
                    b.start(Stack.environment())
    assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert not any("error" in c for c in chunks), chunks
    text = "".join(ch["text"] for c in chunks for ch in c["choices"])
    assert text == ref["choices"][0]["text"]
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"]
            if ch["finish_reason"]] == ["length"]
    assert chunks[-1]["usage"]["completion_tokens"] == ref["usage"]["completion_tokens"] == 256
    assert resumes(replicas) - before == 1  # it really was resumed, not finished on A
    assert watch_until(b.port, idle).finished_requests == 1  # the resumed stream
