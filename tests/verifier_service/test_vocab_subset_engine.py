"""Lossless with a vocabulary-subset head (FR-Spec) through the engine: the draft and MLP
proposers built from their flags with --vocab-subset reading the directory's frequency file
draft only subset tokens, and greedy and seeded sampled output equal speculation off."""

from __future__ import annotations

import asyncio
import shutil
from collections import Counter

import pytest
import torch
from engine_testlib import PROMPTS, make_engine, request, run_all

from proposer_service.config import ProposerConfig
from proposer_service.server import build_proposer
from splitspec.config import parse_config
from splitspec.params import SamplingParams
from splitspec.vocab_frequencies import FREQUENCIES, write_frequencies

SUBSET = 96  # of the tiny target's 1024 tokens
SEEDED = SamplingParams(temperature=0.8, seed=5)


def outputs(engine, method=None, k=0, sampling=None):
    results = asyncio.run(run_all(engine, [
        request(engine, f"r{i}", p, max_tokens=24, method=method, k=k, sampling=sampling)
        for i, p in enumerate(PROMPTS)]))
    return [tokens for tokens, _, _ in results]


@pytest.fixture(scope="module")
def setup(learned_models, tmp_path_factory):
    """Copies of the draft and speculator with a frequency file counted on the target's own
    greedy output, their proposers built from flags, and the off outputs."""
    torch.set_num_threads(1)
    target, draft, spec = learned_models
    base = {"greedy": outputs(make_engine(target)),
            "seeded": outputs(make_engine(target), sampling=SEEDED)}
    counts = Counter(t for out in base["greedy"] for t in out)
    root = tmp_path_factory.mktemp("subset")
    flags = ["--device", "cpu", "--dtype", "float32", "--vocab-subset", str(SUBSET)]
    proposers = {}
    for method, src, extra in (("draft", draft, []), ("mlp", spec, ["--tokenizer", target])):
        d = root / method
        shutil.copytree(src, d)
        write_frequencies(d / FREQUENCIES, counts + Counter(range(1024)), "test")
        proposers[method] = build_proposer(parse_config(ProposerConfig, [
            "--method", method, "--model", str(d), *flags, *extra]))
    return target, proposers, base


@pytest.mark.parametrize("method,k", [("draft", 4), ("mlp", 3)])
def test_subset_drafts_keep_greedy_and_seeded_output(setup, method, k):
    target, proposers, base = setup
    engine = make_engine(target, proposers)
    assert outputs(engine, method, k) == base["greedy"]
    stats = engine.stats.method(method)
    assert stats.accepted_tokens > 0 and stats.proposed_tokens > stats.accepted_tokens
    engine = make_engine(target, proposers)
    assert outputs(engine, method, k, SEEDED) == base["seeded"]
    subset = proposers[method].lean.head.ids if method == "draft" \
        else proposers[method].model.head[0].subset.ids
    assert len(subset) == SUBSET
