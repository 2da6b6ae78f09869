"""A seeded request's tokens are a function of (seed, position) and the target alone: the same
with speculation off, any method and k, drafts dropped at random (a late or missing proposer),
and any batch around it. That is what lets a request resume on another replica unchanged."""

from __future__ import annotations

import asyncio
import random

from engine_testlib import PROMPTS, make_engine, request, run_all

from proposer_service.base import Proposer, ProposerSession
from proposer_service.ngram import NgramProposer
from splitspec.params import SamplingParams
from splitspec.proposal import Draft

SAMPLING = dict(temperature=0.9, top_p=0.95)


class DroppingSession(ProposerSession):
    """n-gram drafts, of which a random half never arrive (as if late)."""

    def __init__(self, seed: int):
        self._ngram = NgramProposer().open_session()
        self._rng = random.Random(seed)

    def propose(self, steps):
        drafts = self._ngram.propose(steps)
        return [d if d.resync or self._rng.random() < 0.5 else Draft(d.seq_id) for d in drafts]

    def release(self, seq_ids):
        self._ngram.release(seq_ids)


class DroppingProposer(Proposer):
    def __init__(self, seed: int):
        self._seed = seed

    def describe(self):
        return NgramProposer().describe()

    def open_session(self):
        return DroppingSession(self._seed)


def seeded_outputs(model_dir: str, k: int, dropping: bool, neighbours: int) -> list[list[int]]:
    proposers = {"ngram": DroppingProposer(k) if dropping else NgramProposer()}
    engine = make_engine(model_dir, proposers=proposers, max_num_seqs=8)
    mine = [request(engine, f"s{i}", p, max_tokens=20, k=k,
                    sampling=SamplingParams(seed=1000 + i, **SAMPLING))
            for i, p in enumerate(PROMPTS[:3])]
    others = [request(engine, f"o{i}", PROMPTS[i % len(PROMPTS)], max_tokens=12, k=2,
                      sampling=SamplingParams(**SAMPLING)) for i in range(neighbours)]
    results = asyncio.run(run_all(engine, mine + others))
    return [tokens for tokens, _, _ in results[:len(mine)]]


def check_seeded_output_ignores_speculation(model_dir: str) -> None:
    alone_off = seeded_outputs(model_dir, k=0, dropping=False, neighbours=0)
    for k, dropping, neighbours in [(3, False, 0), (6, True, 3), (2, True, 5)]:
        assert seeded_outputs(model_dir, k, dropping, neighbours) == alone_off, (k, dropping)


def test_seeded_output_is_the_same_with_any_k_dropped_drafts_and_batch(target_model_dir):
    check_seeded_output_ignores_speculation(target_model_dir)
