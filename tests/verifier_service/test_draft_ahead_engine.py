"""Drafting ahead through the engine (in-process draft proposer drafting ahead in a worker
thread while the engine verifies): greedy output equals speculation off with drafting ahead on
and off, alone and batched, hits and misses are counted, and off asks for no drafting ahead."""

from __future__ import annotations

import asyncio

import pytest
import torch
from engine_testlib import PROMPTS, make_engine, request, run_all

from proposer_service.draft.proposer import DraftModelProposer
from splitspec.params import SamplingParams


@pytest.fixture(scope="module")
def draft(noisy_draft_dir):
    torch.set_num_threads(1)
    return DraftModelProposer.load(noisy_draft_dir, torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def baseline(tiny_target_dir, draft):
    engine = make_engine(tiny_target_dir, {"draft": draft})
    results = asyncio.run(run_all(engine, [request(engine, f"b{i}", p, max_tokens=32)
                                           for i, p in enumerate(PROMPTS)]))
    return [tokens for tokens, _, _ in results]


def run(tiny_target_dir, draft, draft_ahead: str, k: int, max_num_seqs: int = 8,
        sampling: SamplingParams | None = None):
    engine = make_engine(tiny_target_dir, {"draft": draft}, draft_ahead=draft_ahead,
                         max_num_seqs=max_num_seqs)
    results = asyncio.run(run_all(engine, [
        request(engine, f"r{i}", p, max_tokens=32, method="draft", k=k, sampling=sampling)
        for i, p in enumerate(PROMPTS)]))
    return [tokens for tokens, _, _ in results], engine.stats.method("draft")


@pytest.mark.parametrize("k,max_num_seqs", [(2, 1), (5, 1), (4, 8)])
def test_greedy_with_drafting_ahead_equals_speculation_off(tiny_target_dir, draft, baseline, k,
                                                    max_num_seqs):
    outputs, stats = run(tiny_target_dir, draft, "on", k, max_num_seqs)
    assert outputs == baseline
    assert stats.accepted_tokens > 0
    # drafting ahead ran and was used: hits, and misses (outcomes it did not guess)
    assert stats.ahead_hits > 0 and stats.ahead_misses > 0
    # every draft after a sequence's first is either a hit or a miss
    assert stats.ahead_hits + stats.ahead_misses >= stats.drafts - len(PROMPTS)


def test_drafting_ahead_off_drafts_afresh_every_step(tiny_target_dir, draft, baseline):
    outputs, stats = run(tiny_target_dir, draft, "off", 4)
    assert outputs == baseline
    assert stats.drafts > 0 and stats.ahead_hits == stats.ahead_misses == 0


def test_seeded_sampled_output_is_the_same_with_drafting_ahead_on_and_off(tiny_target_dir, draft):
    sampling = SamplingParams(temperature=0.3, seed=3)
    on, stats = run(tiny_target_dir, draft, "on", 4, sampling=sampling)
    off, _ = run(tiny_target_dir, draft, "off", 4, sampling=sampling)
    assert on == off
    assert stats.ahead_hits > 0


def test_auto_measures_each_step_that_asked_the_method(tiny_target_dir, draft, baseline):
    engine = make_engine(tiny_target_dir, {"draft": draft}, draft_ahead="auto", max_num_seqs=1)
    results = asyncio.run(run_all(engine, [
        request(engine, f"r{i}", p, max_tokens=32, method="draft", k=3)
        for i, p in enumerate(PROMPTS)]))
    assert [tokens for tokens, _, _ in results] == baseline
    stats = engine.stats.method("draft")
    measured = engine.drafts.ahead_policy._state("draft")
    assert measured.steps == stats.drafts  # every verified draft's step was measured
    assert stats.ahead_hits > 0  # auto starts with drafting ahead
