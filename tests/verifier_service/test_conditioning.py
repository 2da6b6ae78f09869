"""What the verifier hands a proposer that conditions on the target (MLP speculator's contract):
with every step, the target's final-norm hidden state at the position that produced the
sequence's last token. Checked against an independent forward of the plain model, after steps
that accepted drafts (so the row picked depends on how many were accepted)."""

from __future__ import annotations

import asyncio

import torch
from engine_testlib import PROMPTS, make_engine, request, run_all
from transformers import AutoModelForCausalLM

from proposer_service.base import Proposer, ProposerSession
from proposer_service.ngram import NgramProposer
from splitspec.proposal import ProposerDescription


class RecordingSession(ProposerSession):
    """n-gram drafts (so drafts get accepted on these prompts), and a record of every step's
    history and hidden state."""

    def __init__(self, records: list):
        self._ngram = NgramProposer().open_session()
        self._records = records
        self._histories: dict[str, list[int]] = {}

    def propose(self, steps):
        for s in steps:
            h = list(s.new_tokens) if s.full_history else self._histories[s.seq_id] + s.new_tokens
            self._histories[s.seq_id] = h
            self._records.append((list(h), s.hidden_state))
        return self._ngram.propose(steps)

    def release(self, seq_ids):
        self._ngram.release(seq_ids)


class RecordingProposer(Proposer):
    def __init__(self):
        self.records: list[tuple[list[int], torch.Tensor | None]] = []

    def describe(self):
        return ProposerDescription(method="ngram", needs_hidden_state=True)

    def open_session(self):
        return RecordingSession(self.records)


def sent_hidden_states(model_dir: str) -> list[tuple[list[int], torch.Tensor | None]]:
    proposer = RecordingProposer()
    engine = make_engine(model_dir, proposers={"ngram": proposer}, max_num_seqs=4)
    results = asyncio.run(run_all(engine, [request(engine, f"h{i}", p, max_tokens=16, k=4)
                                           for i, p in enumerate(PROMPTS[:4])]))
    assert sum(last.usage.accepted_tokens for _, _, last in results) > 0  # rows beyond 0 used
    return proposer.records


def check_hidden_states_are_the_targets(model_dir: str) -> None:
    records = sent_hidden_states(model_dir)
    assert len(records) >= 8
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for history, hidden in records:
        assert hidden is not None and hidden.shape == (plain.config.hidden_size,)
        with torch.no_grad():  # the state at the input before the last token: it produced it
            ref = plain.model(input_ids=torch.tensor([history[:-1]])).last_hidden_state[0, -1]
        torch.testing.assert_close(hidden, ref, rtol=1e-3, atol=1e-3)


def test_the_hidden_state_sent_is_the_one_that_produced_the_last_token(target_model_dir):
    check_hidden_states_are_the_targets(target_model_dir)
