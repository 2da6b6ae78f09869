"""The captured sampler of steps that verify nothing (verifier_service/step/sampler.py), run
eagerly on the CPU: the same p as the eager sampler bit for bit, hence the same token for every
greedy and seeded row; unseeded rows draw within their support; nothing read back inside; and a
seeded request's output the same with speculation on and off through the engine."""

from __future__ import annotations

import dataclasses

import planted_bugs as bug
import pytest
import torch
from capture_rules import GraphSafe
from test_seeded_sampling import check_seeded_output_ignores_speculation

import kernels.sampling as sampling
import verifier_service.step.executor as step_executor
from kernels.layout import StepLayout
from splitspec.params import SamplingParams
from verifier_service.step.sampler import StepSampler
from verifier_service.step.sampling_state import StepSampling
from verifier_service.step.verify import _sample_tokens

PARAMS = [SamplingParams(temperature=0.0),
          SamplingParams(temperature=0.8, seed=3),
          SamplingParams(temperature=0.9, top_p=0.9, seed=4),
          SamplingParams(temperature=1.0, top_k=20, seed=5),
          SamplingParams(temperature=0.7, min_p=0.1, seed=6),
          SamplingParams(temperature=1.1, top_k=30, top_p=0.8, min_p=0.05, seed=7),
          SamplingParams(temperature=1.0),
          SamplingParams(temperature=0.6, top_k=5)]
# the same rows without min-p: the eager sampler skips that stage, the captured one runs it
NO_MIN_P = [dataclasses.replace(p, min_p=0.0) for p in PARAMS]
VOCAB = 97


def check_the_sampler_draws_the_eager_samplers_tokens() -> None:
    positions = [4, 9, 17, 2, 30, 11, 5, 8]
    layout = StepLayout.for_drafts([0] * len(PARAMS), positions)
    sampler = StepSampler(torch.device("cpu"), VOCAB, 8, enabled=True)
    for trial, params in [(t, p) for t in range(8) for p in (PARAMS, NO_MIN_P)]:
        logits = torch.randn(len(params), VOCAB, generator=torch.Generator().manual_seed(trial))
        logits[:, :3] *= 4  # a few likely tokens, as a model's logits have
        eager_p = StepSampling.of(params, layout).row_tensors().apply(logits)
        f = sampler.floats
        sampler(logits, params, positions)
        static_p = sampling.apply_sampling_params(logits, f[0], sampler.ints[0], f[1], f[2],
                                                  static=True)
        assert torch.equal(static_p, eager_p), trial  # every stage run: the same p, bit for bit
        got = sampler(logits, params, positions).tolist()
        want = _sample_tokens(logits, eager_p, layout, params).output_token_ids[:, 0].tolist()
        for r, p in enumerate(params):
            if p.greedy or p.seed is not None:
                assert got[r] == want[r], (trial, r)
            else:
                assert eager_p[r, got[r]] > 0, (trial, r)  # a draw within the row's support


def test_the_sampler_draws_the_eager_samplers_tokens():
    check_the_sampler_draws_the_eager_samplers_tokens()


def test_min_p_renormalising_every_row_fails_the_comparison(monkeypatch):
    bug.min_p_renormalises_rows_without_it(monkeypatch)
    with pytest.raises(AssertionError):
        check_the_sampler_draws_the_eager_samplers_tokens()


def test_the_sampler_body_copies_nothing_in_and_reads_nothing_back():
    sampler = StepSampler(torch.device("cpu"), VOCAB, 8, enabled=True)
    sampler(torch.randn(5, VOCAB), PARAMS[:5], [1, 2, 3, 4, 5])  # real inputs in the buffers
    with torch.inference_mode(), GraphSafe():
        for b in sampler.buckets:
            sampler.body(b)


def test_rows_past_the_largest_bucket_are_left_to_the_eager_sampler():
    sampler = StepSampler(torch.device("cpu"), VOCAB, 6, enabled=True)
    assert sampler.buckets == (1, 2, 4, 6)
    assert sampler.serves(6) and not sampler.serves(7)
    assert not StepSampler(torch.device("cpu"), VOCAB, 6, enabled=False).serves(1)


@pytest.fixture
def sampler_on(monkeypatch):
    """Every engine's executor samples undrafted steps through the sampler (run eagerly)."""
    made = []

    def enabled(device, vocab, max_rows, enabled, counts=None):
        made.append(StepSampler(device, vocab, 8, enabled=True, counts=counts))
        return made[-1]

    monkeypatch.setattr(step_executor, "StepSampler", enabled)
    return made


def test_seeded_output_through_the_sampler_is_the_same_on_and_off(sampler_on, target_model_dir):
    check_seeded_output_ignores_speculation(target_model_dir)
    assert sum(s.counts["eager"] for s in sampler_on) > 0  # the undrafted steps went through it


def test_a_sampler_keying_one_position_late_fails_the_check(sampler_on, monkeypatch,
                                                            target_model_dir):
    bug.step_sampler_keyed_one_position_late(monkeypatch)
    with pytest.raises(AssertionError):
        check_seeded_output_ignores_speculation(target_model_dir)
