"""Proposer faults through real processes: a proposer killed mid-generation or restarted, one
that answers late (with correct drafts), with garbage or with RESYNC, and one whose vocabulary
does not fit the target. None of them may change an output or fail a request, and a late answer is
never waited for; a misfit proposer stops the verifier at startup with a clear error.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
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
from learned_testlib import PROMPTS, GenClient, gen_client, learned_stack_config
from polling import wait_until
from services_testlib import on_port
from stats_testlib import idle, method, watch_until

from protos import proposer_pb2, proposer_pb2_grpc, verifier_pb2_grpc
from splitspec.launcher import REPO_ROOT, Service, Stack
from splitspec.modelio import load_tokenizer, tokenizer_fingerprint
from splitspec.net import free_port
from verifier_service.drafts.pool import REVIVE_BACKOFF_S

pytestmark = pytest.mark.integration
VOCAB = 1024  # tests/fixtures/tiny-llama
DEADLINE_S = 0.25  # the verifier's per-step deadline in the late/garbage test
# From the restarted proposer's "serving" log line to the verifier's "connected" one: the
# pool's wait between reconnection attempts (doubling from 1 s, at most 5 s: a restart that
# takes a few seconds on a loaded machine meets the largest) + channel backoff capped at 1 s
# (+20% jitter), plus scheduling room; gRPC's default backoff grows to two minutes.
RECONNECT_BOUND_S = REVIVE_BACKOFF_S[1] + 1.2 + 0.8
RESUME_WAIT_S = 30.0  # requests until speculation is seen again (each is slow on a loaded host)


# -- a killed proposer -------------------------------------------------------------------------

@pytest.mark.soak
def test_killing_proposers_mid_generation_fails_no_request_and_speculation_resumes(
        learned_stack):
    stack = learned_stack
    killed = (stack.proposers["draft"], stack.proposers["mlp"])
    try:
        with gen_client(stack) as client:
            n = 6
            base = client.generate_all([client.request(p, None, max_tokens=64)
                                        for p in PROMPTS[:n]])
            reqs = [client.request(p, "draft" if i % 2 == 0 else "mlp", k=4, max_tokens=64)
                    for i, p in enumerate(PROMPTS[:n])]
            streaming = threading.Event()

            def on_chunk(num_tokens: int) -> None:
                if num_tokens >= 4:
                    streaming.set()

            with ThreadPoolExecutor(n) as pool:
                running = [pool.submit(client.generate, r, 120, on_chunk) for r in reqs]
                assert streaming.wait(60)
                for svc in killed:
                    os.killpg(svc.proc.pid, signal.SIGKILL)
                in_flight = sum(not f.done() for f in running)
                results = [f.result() for f in running]
            assert in_flight > 0
            for b, r in zip(base, results):
                assert r.token_ids == b.token_ids and len(r.token_ids) == 64

            # Restarted on the same ports: the verifier reconnects (a new stream epoch, so full
            # histories are resent) and drafts reach verification again.
            for svc in killed:
                stack.restart(svc)
            accepted = {"draft": 0, "mlp": 0}
            proposed = {"draft": 0, "mlp": 0}

            def both_accepted() -> bool:
                after = client.generate_all(reqs)
                for r, req, b in zip(after, reqs, base):
                    assert r.token_ids == b.token_ids
                    proposed[req.speculation.method] += r.usage.speculation.proposed_tokens
                    accepted[req.speculation.method] += r.usage.speculation.accepted_tokens
                return accepted["draft"] > 0 and accepted["mlp"] > 0

            wait_until(both_accepted, 60, 0, lambda: f"accepted drafts from both; "
                       f"proposed {proposed}, accepted {accepted}")
            print(f"after restart: proposed {proposed}, accepted {accepted}")
    finally:
        for svc in killed:
            if not svc.alive():
                stack.restart(svc)  # the package's learned stack stays whole for later tests


def _log_times(path, needle: str) -> list[float]:
    """Times (epoch seconds) of a service log's lines holding `needle`."""
    from datetime import datetime

    return [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for line in path.read_text(errors="replace").splitlines()
            if needle in line and line[:4].isdigit()]


def test_the_verifier_reconnects_to_a_restarted_proposer_within_seconds(stack):
    """The package stack's n-gram proposer killed and restarted on its port: requests meanwhile
    are served without speculation (same output), and drafts are accepted again soon after the
    proposer is back (the pool's reconnection attempts at most 5 s apart, channel backoff
    capped at 1 s), not after gRPC's default backoff of up to two minutes."""
    ngram = stack.proposers["ngram"]
    client = GenClient(stack.config.grpc_port)
    req = client.request("alpha beta gamma delta " * 8, "ngram", k=4, max_tokens=8)
    try:
        base = client.generate(req)
        assert base.usage.speculation.accepted_tokens > 0
        os.killpg(ngram.proc.pid, signal.SIGKILL)
        ngram.proc.wait()
        gone = client.generate(req)
        assert gone.token_ids == base.token_ids and gone.usage.speculation.proposed_tokens == 0
        stack.restart(ngram)

        def speculating() -> bool:
            res = client.generate(req)
            assert res.token_ids == base.token_ids
            return res.usage.speculation.accepted_tokens > 0

        wait_until(speculating, RESUME_WAIT_S, 0,
                   "speculation to resume after the proposer restarted")
        # the reconnection itself, timed by the two services' own logs (not by the requests,
        # which a loaded machine slows down)
        serving = _log_times(ngram.log_path, "serving on")[-1]
        connected = [t for t in _log_times(stack.verifier.log_path, "connected to ngram proposer")
                     if t >= serving - 1.0]
        assert connected and connected[0] - serving <= RECONNECT_BOUND_S, (serving, connected)
    finally:
        client.close()
        if not ngram.alive():
            stack.restart(ngram)  # the package stack stays whole for the tests after this one


# -- late, garbage and resyncing proposers -------------------------------------------------------

@dataclass
class FakeProposer(proposer_pb2_grpc.ProposerServicer):
    """Serves the real Proposer service with scripted behaviour (`mode`, switchable at any time):

    - "oracle": in time, the drafts the target will accept: the next k tokens of the reference
      continuation that extends the sequence's history (well-formed, fresh, correct);
    - "late": the same drafts, each sent delay_s after its step's request arrived;
    - "garbage": in time, drafts of every malformed kind the verifier must drop (malformed
      token trees included);
    - "resync": RESYNC for every delta (full histories get garbage).
    """

    method: str
    vocab_size: int
    fingerprint: str
    needs_hidden_state: bool = False
    mode: str = "garbage"
    delay_s: float = 0.0
    # token sequences (prompt + output) the oracle drafts from, per request seed (None: greedy)
    references: dict = field(default_factory=dict)
    seen_steps: list = field(default_factory=list)  # the SequenceStep messages received
    answers: int = 0  # responses sent

    def Info(self, request, context):
        return proposer_pb2.ProposerInfo(method=self.method, vocab_size=self.vocab_size,
                                         tokenizer_fingerprint=self.fingerprint,
                                         max_num_speculative_tokens=16,
                                         needs_hidden_state=self.needs_hidden_state,
                                         model="fake")

    def Propose(self, request_iterator, context):
        outbox: queue.Queue = queue.Queue()
        histories: dict[str, list[int]] = {}  # this stream's view of its sequences
        kinds = itertools.cycle(["too_long", "out_of_vocab", "negative", "sum_not_one",
                                 "token_not_in_support", "rows_mismatch", "unknown_seq",
                                 "stale_step", "tree_parent_out_of_range", "tree_cycle",
                                 "tree_too_bushy", "tree_q_rows"])

        def read() -> None:  # answers are due delay_s after their request, not after the last
            try:
                for req in request_iterator:
                    arrived, mode = time.monotonic(), self.mode
                    self.seen_steps.extend(req.sequences)
                    resp = self._answer(req, mode, next(kinds), histories)
                    outbox.put((arrived + (self.delay_s if mode == "late" else 0.0), resp))
            except grpc.RpcError:
                pass  # the verifier closed the stream
            finally:
                outbox.put(None)

        threading.Thread(target=read, daemon=True).start()
        while (item := outbox.get()) is not None:
            due, resp = item
            time.sleep(max(0.0, due - time.monotonic()))
            self.answers += 1
            yield resp

    def _answer(self, req, mode: str, kind: str, histories: dict) -> proposer_pb2.ProposeResponse:
        for seq_id in req.released:
            histories.pop(seq_id, None)
        resp = proposer_pb2.ProposeResponse(
            step_id=req.step_id + (1000 if mode == "garbage" and kind == "stale_step" else 0))
        for s in req.sequences:
            history = histories.setdefault(s.seq_id, [])
            if s.full_history:
                history.clear()
            history.extend(s.new_tokens)
            if mode in ("oracle", "late") and len(history) == s.history_len:
                seed = s.sampling.seed if s.sampling.HasField("seed") else None
                resp.drafts.add(seq_id=s.seq_id, tokens=self._oracle(history, s.k, seed))
            elif mode != "garbage" and not s.full_history:
                resp.drafts.add(seq_id=s.seq_id, status=proposer_pb2.SEQUENCE_STATUS_RESYNC)
            else:
                resp.drafts.append(self._bad_draft(s, kind))
        return resp

    def _oracle(self, history: list[int], k: int, seed) -> list[int]:
        n = len(history)
        for ref in self.references.get(seed, []):
            if len(ref) > n and ref[:n] == history:
                return ref[n:n + k]
        return []

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
        # malformed token trees (SequenceDraft.parents)
        elif kind == "tree_parent_out_of_range":
            d.parents.extend([-1] * (k - 1) + [k + 7])
        elif kind == "tree_cycle":  # every node's parent comes after it
            d.parents.extend(list(range(1, k + 1)))
        elif kind == "tree_too_bushy":  # children of the root, on a step that asked for a chain
            del d.tokens[:]
            d.tokens.extend([3] * max(k, 2))
            d.parents.extend([-1] * len(d.tokens))
        elif kind == "tree_q_rows":  # a well-formed tree, one q row per node plus one
            d.parents.extend([-1] + list(range(k - 1)))
            for _ in range(k + 1):
                d.distributions.add(indices=[3], probs=[1.0])
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


class VerifierClient(GenClient):
    """GenClient on a verifier's own Generate (same messages as the gateway's)."""

    def __init__(self, port: int):
        super().__init__(port)
        self.stub = verifier_pb2_grpc.VerifierStub(self._channel)


@dataclass
class Phase:
    """What one batch of requests did, seen from the client and from the verifier's stats."""

    outputs: list[list[int]]
    proposed_tokens: int  # draft tokens verified, summed over the requests' usage
    accepted: int
    steps: int  # verifier steps that asked the "draft" proposer
    missed: int  # of those, steps without a usable answer before the deadline
    answers: int  # answers the fake proposer sent meanwhile


def run_phase(port: int, fake: FakeProposer, reqs) -> Phase:
    before = watch_until(port, idle)
    fake.answers = 0
    with contextlib.closing(VerifierClient(port)) as client:
        results = client.generate_all(reqs)
    after = watch_until(port, lambda s: idle(s) and s.finished_requests
                        >= before.finished_requests + len(reqs))
    m0, m1 = method(before, "draft"), method(after, "draft")
    return Phase([r.token_ids for r in results],
                 sum(r.usage.speculation.proposed_tokens for r in results),
                 sum(r.usage.speculation.accepted_tokens for r in results),
                 m1.steps - m0.steps, m1.missed_steps - m0.missed_steps, fake.answers)


def check_late_drafts_were_not_waited_for(phase: Phase, base: list[list[int]]) -> None:
    """Correct drafts that come after the deadline: the step went on without them."""
    assert phase.answers > 0, "the proposer sent no answer at all"
    assert phase.outputs == base
    assert phase.proposed_tokens == 0, \
        f"{phase.proposed_tokens} late draft tokens reached verification"
    assert phase.steps > 0 and phase.missed == phase.steps, \
        f"{phase.missed} of {phase.steps} steps counted as missed"


def test_late_or_garbage_answers_change_no_output(learned_models, fingerprint, tiny_target_dir,
                                                 tmp_path):
    """A "draft" proposer that answers first in time with correct drafts (they are accepted),
    then with the same correct drafts after the deadline, then in time with drafts of every
    malformed kind, then with RESYNC for every delta; and an "mlp" proposer with garbage.

    Late answers are not waited for: the output is unchanged, no draft is verified, and every
    step counts as missed in the verifier's stats. The check is shown to catch a verifier that
    waits past its deadline (the same phase against a verifier whose deadline exceeds the delay
    fails it). Greedy and seeded sampled outputs equal speculation off whenever every draft is
    dropped."""
    target = learned_models[0]
    late = FakeProposer("draft", VOCAB, fingerprint, delay_s=2 * DEADLINE_S)
    mlp = FakeProposer("mlp", VOCAB, fingerprint, needs_hidden_state=True)
    servers = [serve_fake(late), serve_fake(mlp)]
    waiting_verifier = None
    try:
        config = learned_stack_config(
            target, None, None, tmp_path / "fake-logs", timeout_ms=DEADLINE_S * 1000,
            verifier_args=["--proposer", f"draft=127.0.0.1:{servers[0][1]}",
                           "--proposer", f"mlp=127.0.0.1:{servers[1][1]}"])
        with Stack(config) as stack:
            port = stack.verifier.port
            # For the negative control below: a verifier that waits longer than the late
            # answers take (its deadline far beyond the delay), on the same proposers. It starts
            # now, loading its model while the phases before it run.
            waiting_port = free_port()
            waiting_verifier = Service("verifier-waits", [
                *on_port(stack.verifier.argv, waiting_port),
                "--proposer-timeout-ms", str(20_000 * late.delay_s)], waiting_port,
                tmp_path / "verifier-waits.log")
            waiting_verifier.start(Stack.environment())

            def requests(method, sampled=True):
                reqs = [GenClient.request(p, method, k=4, max_tokens=8) for p in PROMPTS[:4]]
                if sampled:
                    reqs += [GenClient.request(p, method, k=4, max_tokens=8, temperature=0.8,
                                               top_p=0.95, seed=7 + i)
                             for i, p in enumerate(PROMPTS[:4])]
                return reqs

            def both(method):
                return run_phase(port, late if method == "draft" else mlp,
                                 requests(method)).outputs

            base = both(None)
            tok = load_tokenizer(target)
            for req, out in zip(requests(None), base):
                seed = req.sampling.seed if req.sampling.HasField("seed") else None
                late.references.setdefault(seed, []).append(
                    tok.encode(req.text, add_special_tokens=False) + out)

            # In time, the oracle's drafts are accepted: they are well-formed and correct.
            late.mode = "oracle"
            on_time = run_phase(port, late, requests("draft", sampled=False))
            assert on_time.outputs == base[:4] and on_time.accepted > 0
            assert on_time.missed < on_time.steps

            late.mode = "late"
            check_late_drafts_were_not_waited_for(run_phase(port, late, requests("draft")), base)

            # Negative control: the verifier that waits uses the late drafts, and the check
            # above catches it.
            waited = run_phase(waiting_port, late, requests("draft", sampled=False))
            # the planted bug is the one meant: late drafts were used
            assert waited.proposed_tokens > 0
            with pytest.raises(AssertionError):
                check_late_drafts_were_not_waited_for(waited, base[:4])
            waiting_verifier.stop()

            late.mode = "garbage"
            garbage = run_phase(port, late, requests("draft"))
            # every malformed draft and tree was dropped: none reached verification
            assert garbage.outputs == base and garbage.answers > 0
            assert garbage.proposed_tokens == 0, garbage
            assert both("draft") == base
            assert both("mlp") == base
            late.mode, late.seen_steps = "resync", []
            resync = run_phase(port, late, requests("draft"))
            assert resync.outputs == base
            resyncs = late.seen_steps
    finally:
        if waiting_verifier is not None:
            waiting_verifier.stop()
        for server, _ in servers:
            server.stop(0)
    # The hidden state goes to the proposer that asked for it, and only there.
    assert mlp.seen_steps and all(s.HasField("hidden_state") for s in mlp.seen_steps)
    h = mlp.seen_steps[-1].hidden_state
    assert list(h.shape) == [64] and h.dtype == "float32" and len(h.data) == 64 * 4
    assert not any(s.HasField("hidden_state") for s in late.seen_steps)
    # RESYNC for every delta: each sequence starts with its full history, a full history is
    # always followed by a delta, and RESYNC answers did bring full histories back. When no
    # answer missed its deadline, every delta (answered RESYNC) is followed by a full history.
    by_seq: dict[str, list] = {}
    for s in resyncs:
        by_seq.setdefault(s.seq_id, []).append(s)
    assert len(by_seq) == 8
    for steps in by_seq.values():
        assert steps[0].full_history and len(steps) > 2
        assert sum(s.full_history for s in steps[1:]) >= 1
        for prev, cur in zip(steps, steps[1:]):
            if cur.full_history:
                assert len(cur.new_tokens) == cur.history_len
            if prev.full_history:
                assert not cur.full_history
            elif resync.missed == 0:
                assert cur.full_history


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
