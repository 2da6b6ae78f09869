"""The verifier's warm-up (verifier_service/step/warmup.py) on the toy target: every part runs, the
samplers once on the device, and the warm-up requests leave no sequence or KV block behind."""

from __future__ import annotations

import asyncio

import torch
from engine_testlib import drained, make_engine

from verifier_service.step.warmup import warm_samplers, warm_up


def test_warm_up_runs_every_part_and_leaves_nothing_behind(target_model_dir):
    engine = make_engine(target_model_dir)

    async def run():
        engine.start()
        try:
            return await warm_up(engine)
        finally:
            await engine.shutdown()

    took = asyncio.run(run())
    assert set(took) == {"graphs", "samplers", "requests", "total"}
    # plain, lookahead greedy and sampled ran; the stats then start afresh
    assert engine.stats.finished_requests == 0 and engine.stats.steps == 0
    assert engine.drafts.in_target.stats()["lookahead"]["window_nodes_total"] > 0
    assert engine.executor.stats.graphs == 0  # the CPU captures none
    assert drained(engine)


def test_the_samplers_warm_on_small_inputs():
    warm_samplers(torch.device("cpu"), vocab=50)
