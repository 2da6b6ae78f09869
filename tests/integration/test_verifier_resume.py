"""A stream survives the death of the verifier serving it: the gateway resumes it on another
replica from the output the client already has, and the client sees one uninterrupted stream
whose tokens, text and usage are those of an undisturbed run (greedy and seeded sampled);
unseeded sampled streams resume with a valid sample.

Two replicas behind one gateway (the `replicas` fixture). To put every stream on one replica,
the other one is down when they start; it comes back after the first one is killed (the
gateway's --resume-wait-s lets the streams wait for it), so all of them must resume there."""

from __future__ import annotations

import grpc
import pytest
from learned_testlib import GenClient
from replicas_testlib import kill, run_in_flight
from stats_testlib import current, idle, watch_until

from protos import common_pb2
from splitspec.launcher import Stack
from splitspec.modelio import load_tokenizer

pytestmark = pytest.mark.integration

PROMPTS = ["def f(x):\n", "class A:\n    def", "import os\n", "for i in range(",
           "# add two numbers\n", "x = [", "while True:\n", "if __name__ =="]


def kill_and_resume_elsewhere(stack: Stack, client: GenClient,
                              reqs: list[common_pb2.GenerateRequest]):
    """Every request streaming on replica A (B down), A killed, B started: their results."""
    a, b = stack.verifiers
    kill(b)

    def kill_a_start_b():
        assert current(a.port).running == len(reqs)
        kill(a)
        b.start(Stack.environment())

    results = run_in_flight(client, reqs, 6, kill_a_start_b)
    for r in results:
        assert not isinstance(r, grpc.RpcError), f"a stream failed: {r.code()} {r.details()}"
    stats = watch_until(b.port, idle)
    assert stats.finished_requests == 1 + len(reqs)  # warm-up + every stream, resumed on B
    return results


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
    check_same(kill_and_resume_elsewhere(replicas, client, reqs), refs)


def test_killing_the_verifier_of_8_seeded_streams_leaves_their_output_unchanged(
        replicas, replica_client, target_model_dir):
    client = replica_client
    reqs = [client.request(p, "ngram" if i % 2 else None, k=3, max_tokens=72,
                           temperature=0.8, top_p=0.95, seed=1000 + i)
            for i, p in enumerate(PROMPTS[:6])]
    unseeded = [client.request(p, None, max_tokens=72, temperature=0.8)
                for p in PROMPTS[6:]]
    refs = client.generate_all(reqs)
    results = kill_and_resume_elsewhere(replicas, client, reqs + unseeded)
    check_same(results[:6], refs)
    tok = load_tokenizer(target_model_dir)
    for r in results[6:]:  # a valid sample: full length, text that decodes from its tokens
        assert len(r.token_ids) == r.usage.completion_tokens == 72
        assert r.text and tok.decode(r.token_ids, skip_special_tokens=True).startswith(r.text)
