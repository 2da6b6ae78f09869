"""Proposer faults through real processes: a proposer killed mid-generation, one that answers
late or with garbage, and one whose vocabulary does not fit the target. None of them may change
an output or fail a request; a misfit proposer stops the verifier at startup with a clear error.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import pytest

from learned_testlib import PROMPTS, gen_client, learned_stack_config, make_models
from protos import proposer_pb2, proposer_pb2_grpc
from splitspec.launcher import REPO_ROOT, Stack
from splitspec.modelio import load_tokenizer, tokenizer_fingerprint
from splitspec.net import free_port

pytestmark = pytest.mark.integration
VOCAB = 1024  # tests/fixtures/tiny-llama
DEADLINE_S = 0.25  # the verifier's per-step deadline in the late/garbage test


@pytest.fixture(scope="module")
def models(tiny_target_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    return make_models(tiny_target_dir, root), root


# -- a killed proposer -------------------------------------------------------------------------

def test_killing_proposers_mid_generation_fails_no_request_and_speculation_resumes(models):
    (target, draft, spec), root = models
    with Stack(learned_stack_config(target, draft, spec, root / "kill-logs")) as stack, \
            gen_client(stack) as client:
        n = 6
        base = client.generate_all([client.request(p, None, max_tokens=64) for p in PROMPTS[:n]])
        reqs = [client.request(p, "draft" if i % 2 == 0 else "mlp", k=4, max_tokens=64)
                for i, p in enumerate(PROMPTS[:n])]
        streaming = threading.Event()

        def on_chunk(num_tokens: int) -> None:
            if num_tokens >= 4:
                streaming.set()

        with ThreadPoolExecutor(n) as pool:
            running = [pool.submit(client.generate, r, 120, on_chunk) for r in reqs]
            assert streaming.wait(60)
            for svc in (stack.draft, stack.mlp):
                os.killpg(svc.proc.pid, signal.SIGKILL)
            in_flight = sum(not f.done() for f in running)
            results = [f.result() for f in running]
        assert in_flight > 0
        for b, r in zip(base, results):
            assert r.token_ids == b.token_ids and len(r.token_ids) == 64

        # Restarted on the same ports: the verifier reconnects (a new stream epoch, so full
        # histories are resent) and drafts reach verification again.
        for svc in (stack.draft, stack.mlp):
            stack.restart(svc)
        deadline = time.monotonic() + 60
        accepted = {"draft": 0, "mlp": 0}
        proposed = {"draft": 0, "mlp": 0}
        while time.monotonic() < deadline and not (accepted["draft"] and accepted["mlp"]):
            after = client.generate_all(reqs)
            for r, req, b in zip(after, reqs, base):
                assert r.token_ids == b.token_ids
                proposed[req.speculation.method] += r.usage.speculation.proposed_tokens
                accepted[req.speculation.method] += r.usage.speculation.accepted_tokens
        print(f"after restart: proposed {proposed}, accepted {accepted}")
        assert accepted["draft"] > 0 and accepted["mlp"] > 0


# -- late and garbage proposers --------------------------------------------------------------

@dataclass
class FakeProposer(proposer_pb2_grpc.ProposerServicer):
    """Serves the real Proposer service, badly: late, or with drafts the verifier must drop."""

    method: str
    vocab_size: int
    fingerprint: str
    needs_hidden_state: bool = False
    mode: str = "garbage"  # "late" | "garbage" | "resync" (RESYNC for every delta)
    delay_s: float = 0.0
    seen_steps: list = field(default_factory=list)  # the SequenceStep messages received
    arrivals: list = field(default_factory=list)  # time.monotonic() of each of them

    def Info(self, request, context):
        return proposer_pb2.ProposerInfo(method=self.method, vocab_size=self.vocab_size,
                                         tokenizer_fingerprint=self.fingerprint,
                                         max_num_speculative_tokens=16,
                                         needs_hidden_state=self.needs_hidden_state,
                                         model="fake")

    def Propose(self, request_iterator, context):
        kinds = itertools.cycle(["too_long", "out_of_vocab", "negative", "sum_not_one",
                                 "token_not_in_support", "rows_mismatch", "unknown_seq",
                                 "stale_step"])
        for req in request_iterator:
            self.seen_steps.extend(req.sequences)
            self.arrivals.extend([time.monotonic()] * len(req.sequences))
            if self.mode == "late":
                time.sleep(self.delay_s)
            kind = next(kinds)
            resp = proposer_pb2.ProposeResponse(
                step_id=req.step_id + (1000 if kind == "stale_step" else 0))
            for s in req.sequences:
                if self.mode == "resync" and not s.full_history:
                    resp.drafts.add(seq_id=s.seq_id, status=proposer_pb2.SEQUENCE_STATUS_RESYNC)
                else:
                    resp.drafts.append(self._bad_draft(s, kind))
            yield resp

    def _bad_draft(self, s, kind: str) -> proposer_pb2.SequenceDraft:
        k = max(s.k, 1)
        d = proposer_pb2.SequenceDraft(seq_id=s.seq_id, tokens=[3] * k)
        if kind == "too_long":
            d.tokens.extend([3] * 2)
        elif kind == "out_of_vocab":
            d.tokens[-1] = self.vocab_size + 5
        elif kind == "negative":
            d.tokens[0] = -1
        elif kind == "sum_not_one":
            for _ in range(k):
                d.distributions.add(indices=[3, 4], probs=[0.9, 0.9])
        elif kind == "token_not_in_support":
            for _ in range(k):
                d.distributions.add(indices=[4, 5], probs=[0.5, 0.5])
        elif kind == "rows_mismatch":  # one distribution row too few or too many
            for _ in range(k - 1 if k > 1 else 2):
                d.distributions.add(indices=[3], probs=[1.0])
        elif kind == "unknown_seq":
            d.seq_id = "no-such-" + s.seq_id
        return d


def serve_fake(fake: FakeProposer) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    proposer_pb2_grpc.add_ProposerServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@pytest.fixture(scope="module")
def fingerprint(tiny_target_dir):
    return tokenizer_fingerprint(load_tokenizer(tiny_target_dir))


def test_late_or_garbage_answers_change_no_output(models, fingerprint):
    """A "draft" proposer that answers every step after the deadline, then in time with drafts
    of every malformed kind, then with RESYNC for every delta; and an "mlp" proposer with
    garbage. Greedy and seeded sampled outputs equal speculation off (every draft is dropped, so
    even the sampled requests draw exactly what they draw without speculation)."""
    (target, _, _), root = models
    late = FakeProposer("draft", VOCAB, fingerprint, mode="late", delay_s=2 * DEADLINE_S)
    mlp = FakeProposer("mlp", VOCAB, fingerprint, needs_hidden_state=True)
    servers = [serve_fake(late), serve_fake(mlp)]
    try:
        config = learned_stack_config(
            target, None, None, root / "fake-logs", timeout_ms=DEADLINE_S * 1000,
            verifier_args=["--proposer", f"draft=127.0.0.1:{servers[0][1]}",
                           "--proposer", f"mlp=127.0.0.1:{servers[1][1]}"])
        with Stack(config) as stack, gen_client(stack) as client:
            def both(method):
                greedy = [client.request(p, method, k=4, max_tokens=12) for p in PROMPTS[:4]]
                sampled = [client.request(p, method, k=4, max_tokens=12, temperature=0.8,
                                          top_p=0.95, seed=7 + i)
                           for i, p in enumerate(PROMPTS[:4])]
                return [r.token_ids for r in client.generate_all(greedy + sampled)]

            base = both(None)
            assert both("draft") == base  # late: every answer dropped at the deadline
            assert late.seen_steps
            late.mode = "garbage"
            assert both("draft") == base
            assert both("mlp") == base
            late.mode, late.seen_steps, late.arrivals = "resync", [], []
            assert both("draft") == base
            resyncs, arrivals = late.seen_steps, late.arrivals
    finally:
        for server, _ in servers:
            server.stop(0)
    # The hidden state goes to the proposer that asked for it, and only there.
    assert mlp.seen_steps and all(s.HasField("hidden_state") for s in mlp.seen_steps)
    h = mlp.seen_steps[-1].hidden_state
    assert list(h.shape) == [64] and h.dtype == "float32" and len(h.data) == 64 * 4
    assert not any(s.HasField("hidden_state") for s in late.seen_steps)
    # Every RESYNC answer is followed by the sequence's full history on its next step.
    # (A RESYNC that misses the deadline is dropped like any late answer: then the next step
    # is a delta again, answered RESYNC again.)
    by_seq: dict[str, list] = {}
    for s, t in zip(resyncs, arrivals):
        by_seq.setdefault(s.seq_id, []).append((s, t))
    for steps in by_seq.values():
        assert steps[0][0].full_history and len(steps) > 2
        for (prev, t0), (cur, t1) in zip(steps, steps[1:]):
            if cur.full_history:
                assert len(cur.new_tokens) == cur.history_len
            elif not prev.full_history:
                # prev's RESYNC came too late to count. The verifier's deadline starts before it
                # sends, so on this (proposer's) clock the gap may fall short of the deadline by
                # the message's delivery time on a busy machine: allow up to 50 ms of it.
                assert t1 - t0 >= DEADLINE_S - 0.05


# -- a proposer that does not fit the target ---------------------------------------------------

@pytest.mark.parametrize("vocab, fp, message", [
    (4096, None, "vocabulary size 4096"),
    (VOCAB, "0123456789abcdef", "different tokenizer"),
])
def test_the_verifier_refuses_a_proposer_with_another_vocabulary(tiny_target_dir, fingerprint,
                                                                 vocab, fp, message):
    server, port = serve_fake(FakeProposer("draft", vocab, fp or fingerprint))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "verifier_service.server", "--model", tiny_target_dir,
             "--device", "cpu", "--threads", "1", "--port", str(free_port()),
             "--proposer", f"draft=127.0.0.1:{port}"],
            cwd=REPO_ROOT, env=Stack.environment(), capture_output=True, text=True, timeout=120)
    finally:
        server.stop(0)
    assert proc.returncode != 0
    assert message in proc.stderr and "refusing" in proc.stderr
