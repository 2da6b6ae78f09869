"""A verifier serving a shape from its config alone (--load-format dummy): the tiny shape of
models/shapes with a dummy EAGLE-3 head of its shape. The output is meaningless, the engine's
guarantees are not: greedy output with EAGLE chains and trees equals speculation off, and every
KV block comes back."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from engine_testlib import drained, make_engine, request_ids, run_all

SHAPES = Path(__file__).resolve().parents[2] / "models" / "shapes"
PROMPTS = [[5, 17, 42, 8, 33, 61, 12, 70, 3, 25], [100, 200, 300, 7, 9, 11] * 2]


def _serve(engine, inputs):
    return [tokens for tokens, _, _ in asyncio.run(run_all(engine, inputs))]


def test_a_dummy_target_and_eagle_head_serve_losslessly():
    target, head = str(SHAPES / "tiny-llama"), str(SHAPES / "tiny-llama-eagle3")
    engine = make_engine(target, proposers={}, load_format="dummy", load_seed=7, eagle=head)
    assert engine.tokenizer.decode([300]) == "<id 300>"  # the byte-level fallback
    off = [request_ids(f"o{i}", p, max_tokens=12) for i, p in enumerate(PROMPTS)]
    chain = request_ids("chain", PROMPTS[0], max_tokens=12, method="eagle", k=4)
    tree = request_ids("tree", PROMPTS[1], max_tokens=12, method="eagle", k=6)
    tree = dataclasses.replace(tree, speculation=dataclasses.replace(tree.speculation,
                                                                      num_branches=2))
    plain_a, plain_b, on_a, on_b = _serve(engine, off + [chain, tree])
    assert (on_a, on_b) == (plain_a, plain_b)
    assert engine.stats.method("eagle").proposed_tokens > 0
    assert drained(engine)
