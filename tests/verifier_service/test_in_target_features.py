"""The target's features handed to an in-target state that reads them (ModelRunner.
feature_layers; heads such as EAGLE's): every position whose next token is known arrives once,
in order, through prefill chunks and each step's kept rows, with the values of a plain
forward's layer inputs there, whatever the steps kept (chains, trees, chunked prefill)."""

from __future__ import annotations

import asyncio
import dataclasses

import planted_bugs as bug
import pytest
import torch
from engine_testlib import PROMPTS, make_engine, request, run_all
from transformers import AutoModelForCausalLM

from splitspec.methods import METHODS, Capabilities, Kind, MethodSpec
from splitspec.proposal import Draft
from verifier_service.methods.in_target import InTargetMethod, InTargetState

NAME = "feature-recorder"
LAYERS = (1, 3)


class Recorder(InTargetMethod):
    """Drafts a small tree (two guesses, then a chain under the first) and records what it is
    handed: position -> features row."""

    seen: dict = {}

    def bind(self, runner):
        runner.feature_layers = LAYERS

    def admit(self, request_id, tokens, sampling, plan):
        Recorder.seen[request_id] = {}
        return _State(Recorder.seen[request_id], request_id)


class _State(InTargetState):
    features = True

    def __init__(self, seen, request_id):
        self.seen, self.request_id = seen, request_id

    def _put(self, features, position):
        for j, row in enumerate(features.cpu()):
            assert position + j not in self.seen, "a position handed over twice"
            self.seen[position + j] = row

    def prefilled(self, features, position):
        self._put(features, position)

    def observe(self, outcome):
        self._put(outcome.features, outcome.position)

    def propose(self, tokens, k):
        t = tokens[-1]
        return Draft(self.request_id, [t, (t + 1) % 4096, t][:k], parents=[-1, -1, 0][:k])


@pytest.fixture
def recorder(monkeypatch):
    monkeypatch.setitem(METHODS, NAME, MethodSpec(
        NAME, "records the target's features", f"{__name__}:Recorder", Capabilities(),
        kind=Kind.IN_TARGET))
    Recorder.seen = {}
    return Recorder


def check_features(target_model_dir, recorder):
    # chunked prefill (12-token chunks), trees verified, a plain request beside them
    engine = make_engine(target_model_dir, max_num_batched_tokens=12)
    inputs = []
    for i, p in enumerate(PROMPTS[:2]):
        inp = request(engine, f"r{i}", p, max_tokens=20, method=NAME, k=3)
        inputs.append(dataclasses.replace(inp, speculation=dataclasses.replace(
            inp.speculation, num_branches=2)))
    inputs.append(request(engine, "plain", PROMPTS[2], max_tokens=20))
    results = asyncio.run(run_all(engine, inputs))
    model = AutoModelForCausalLM.from_pretrained(target_model_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    for i, (tokens, _, _) in enumerate(results[:2]):
        prompt = list(inputs[i].prompt_token_ids)
        seen = recorder.seen[f"r{i}"]
        full = prompt + tokens
        # every position but the last two (the final step's root and its emitted token)
        assert sorted(seen) == list(range(len(seen)))
        assert len(seen) >= len(full) - 2
        with torch.no_grad():
            out = model(torch.tensor([full]), output_hidden_states=True)
        # hidden_states[l] is the input of layer l (embedding output for l = 0)
        ref = torch.cat([out.hidden_states[layer][0] for layer in LAYERS], -1)
        got = torch.stack([seen[p] for p in sorted(seen)])
        # (the verifier multiplies by packed weights: the last bits of a few values differ)
        torch.testing.assert_close(got, ref[:len(got)], rtol=1e-3, atol=1e-3)


def test_every_known_position_arrives_once_with_the_plain_forwards_features(
        target_model_dir, recorder):
    check_features(target_model_dir, recorder)


def test_the_check_catches_features_one_row_late(target_model_dir, recorder, monkeypatch):
    bug.features_one_row_late(monkeypatch)
    with pytest.raises(AssertionError):
        check_features(target_model_dir, recorder)
