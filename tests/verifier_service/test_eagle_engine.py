"""EAGLE heads inside the engine (verifier_service/eagle.py, registry method `eagle`): random
heads of both formats on the tiny target, chains and EAGLE-2 trees, batched with plain
requests: greedy output equals speculation off, seeded sampled output is identical on and off,
and nothing leaks; a head that does not fit the target is refused at start-up."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from eagle_testlib import head_for_target
from engine_testlib import drained, make_engine, request_ids, run_all

from splitspec.params import SamplingParams

PROMPTS = [[5, 17, 42, 8, 33, 61, 12, 70, 3, 25] * 2, [100, 200, 300, 7, 9, 11] * 3,
           list(range(40, 70))]


@pytest.fixture(scope="module", params=[3, 1], ids=["eagle3", "eagle1"])
def head(request, tiny_target_dir, tmp_path_factory):
    return str(head_for_target(tmp_path_factory.mktemp(f"eagle{request.param}"),
                               tiny_target_dir, request.param))


def _plan(inp, branches: int):
    return dataclasses.replace(inp, speculation=dataclasses.replace(
        inp.speculation, num_branches=branches))


def _serve(engine, inputs):
    return [tokens for tokens, _, _ in asyncio.run(run_all(engine, inputs))]


def test_greedy_chains_and_trees_equal_speculation_off(tiny_target_dir, head):
    off = _serve(make_engine(tiny_target_dir, proposers={}),
                 [request_ids(f"o{i}", p, max_tokens=24) for i, p in enumerate(PROMPTS)])
    engine = make_engine(tiny_target_dir, proposers={}, eagle=head, max_num_batched_tokens=16)
    inputs = [request_ids("chain", PROMPTS[0], max_tokens=24, method="eagle", k=4),
              _plan(request_ids("tree", PROMPTS[1], max_tokens=24, method="eagle", k=6), 2),
              request_ids("plain", PROMPTS[2], max_tokens=24)]
    assert _serve(engine, inputs) == off
    usage = engine.stats.method("eagle")
    assert usage.proposed_tokens > 0
    assert drained(engine) and engine.drafts.in_target.num_states == 0
    # the head's learning from each verified step is its standing cost per sequence and step
    # (what a paused sequence still pays: adaptive k prices it on both sides)
    assert usage.standing[0] >= usage.drafts > 0 and usage.standing[1] > 0


def test_seeded_sampled_output_is_identical_on_and_off(tiny_target_dir, head):
    seeded = SamplingParams(temperature=0.9, seed=5)
    engine = make_engine(tiny_target_dir, proposers={}, eagle=head)
    off, chain, tree = _serve(engine, [
        request_ids("off", PROMPTS[0], max_tokens=20, sampling=seeded),
        request_ids("chain", PROMPTS[0], max_tokens=20, method="eagle", k=4, sampling=seeded),
        _plan(request_ids("tree", PROMPTS[0], max_tokens=20, method="eagle", k=5,
                          sampling=seeded), 3)])
    assert chain == off and tree == off
    assert engine.stats.method("eagle").proposed_tokens > 0


def test_a_head_for_another_target_is_refused_at_start_up(target_model_dir, head):
    with pytest.raises(ValueError, match="eagle"):
        make_engine(target_model_dir, proposers={}, eagle=head)
