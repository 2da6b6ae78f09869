"""The learned drafters (the draft model, the MLP speculator) apply a request's logit bias and
allowed token ids to their own logits, so that acceptance holds up when a request shapes the
target with them; output stays the target's either way (tests/verifier_service/
test_processors_engine.py). With the control, drafters that ignore them, acceptance collapses."""

from __future__ import annotations

import asyncio

import planted_bugs as bug
import pytest
import torch
from engine_testlib import PROMPTS, learned_drafters, make_engine, request, run_all

from splitspec.params import SamplingParams


@pytest.fixture(scope="module")
def drafters(learned_models):
    torch.set_num_threads(1)
    return learned_models[0], learned_drafters(learned_models)


def acceptance(drafters, method: str) -> float:
    target, proposers = drafters
    engine = make_engine(target, {method: proposers[method]})
    # a bias that takes over the target's choice every other token or so, and a narrowed vocabulary
    sampling = SamplingParams(temperature=0.0, logit_bias=((42, 12.0), (7, 9.0)),
                              allowed_token_ids=tuple(range(0, 1024, 2)))
    off = [t for t, _, _ in asyncio.run(run_all(make_engine(target, {}), [
        request(engine, f"o{i}", p, max_tokens=24, sampling=sampling)
        for i, p in enumerate(PROMPTS[:4])]))]
    got = [t for t, _, _ in asyncio.run(run_all(engine, [
        request(engine, f"r{i}", p, max_tokens=24, method=method, k=3, sampling=sampling)
        for i, p in enumerate(PROMPTS[:4])]))]
    assert got == off  # lossless whatever the drafter does
    stats = engine.stats.method(method)
    return stats.accepted_tokens / stats.proposed_tokens


@pytest.mark.parametrize("method", ["draft", "mlp"])
def test_drafters_propose_what_the_biased_target_prefers(drafters, method, monkeypatch):
    shaped = acceptance(drafters, method)
    bug.drafters_ignore_logit_bias(monkeypatch)
    ignored = acceptance(drafters, method)
    assert shaped > 0.5 and shaped > ignored + 0.2, (shaped, ignored)
