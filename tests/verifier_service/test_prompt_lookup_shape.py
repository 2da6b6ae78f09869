"""Prompt lookup's match range per request (SpeculationPlan.prompt_lookup_min/max): the verifier
sends it to the n-gram proposer with every step of the sequence, and greedy output stays the
output with speculation off."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from engine_testlib import PROMPTS, make_engine, request, run_all

from proposer_service.ngram import NgramProposer, NgramSession
from splitspec.params import SpeculationPlan


class RecordingNgram(NgramProposer):
    """An n-gram proposer that records the range every step asked for."""

    def __init__(self):
        super().__init__()
        self.ranges: set[tuple[int, int]] = set()

    def open_session(self) -> NgramSession:
        proposer, session = self, super().open_session()
        draft = session.draft

        def recording(step, history):
            proposer.ranges.add((step.ngram_min, step.ngram_max))
            return draft(step, history)

        session.draft = recording
        return session


@pytest.fixture(scope="module")
def baseline(target_model_dir):
    engine = make_engine(target_model_dir)
    results = asyncio.run(run_all(engine, [request(engine, f"b{i}", p, k=0)
                                           for i, p in enumerate(PROMPTS[:3])]))
    return [r[0] for r in results]


@pytest.mark.parametrize("lo, hi", [(1, 1), (2, 3), (3, 8)])
def test_greedy_with_a_requests_range_equals_off_and_the_range_reaches_the_proposer(
        target_model_dir, baseline, lo, hi):
    ngram = RecordingNgram()
    engine = make_engine(target_model_dir, {"ngram": ngram})
    inputs = [dataclasses.replace(request(engine, f"r{i}", p), speculation=SpeculationPlan(
        "ngram", 4, prompt_lookup_min=lo, prompt_lookup_max=hi))
        for i, p in enumerate(PROMPTS[:3])]
    results = asyncio.run(run_all(engine, inputs))
    assert [r[0] for r in results] == baseline
    assert ngram.ranges == {(lo, hi)}
    assert all(r[2].usage.method == "ngram" for r in results)


def test_a_hybrid_with_ngram_sends_the_range_to_its_ngram_component(target_model_dir,
                                                                     baseline):
    from proposer_service.suffix import SuffixProposer

    ngram = RecordingNgram()
    engine = make_engine(target_model_dir, {"ngram": ngram, "suffix": SuffixProposer()})
    inputs = [dataclasses.replace(request(engine, f"h{i}", p), speculation=SpeculationPlan(
        "hybrid:ngram+suffix", 4, prompt_lookup_min=2, prompt_lookup_max=2))
        for i, p in enumerate(PROMPTS[:3])]
    results = asyncio.run(run_all(engine, inputs))
    assert [r[0] for r in results] == baseline
    assert ngram.ranges == {(2, 2)}
