"""--quantization int8: the target's products on int8 weights (kernels/int8_dot.py), lossless with
respect to the quantized model: greedy output the same with speculation off, with an n-gram chain
and with an n-gram tree, and seeded sampled output the same off and on. Refused, with the reason,
where the int8 product cannot run or clashes with other flags."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from engine_testlib import PROMPTS, make_engine, request, run_all

from kernels.linear import available
from splitspec.errors import StartupError
from splitspec.params import SamplingParams
from verifier_service.config import VerifierConfig
from verifier_service.config_check import config_problems
from verifier_service.model import quantization

SEEDED = SamplingParams(temperature=0.8, seed=11)


def _runs(engine, rows):
    """(rid, prompt, k, branches, sampling) per request, all in one engine's steps."""
    inputs = []
    for rid, prompt, k, branches, sampling in rows:
        inp = request(engine, rid, prompt, max_tokens=24, k=k, sampling=sampling)
        if branches > 1:
            inp = dataclasses.replace(inp, speculation=dataclasses.replace(
                inp.speculation, num_branches=branches))
        inputs.append(inp)
    return [tokens for tokens, _, _ in asyncio.run(run_all(engine, inputs))]


@pytest.mark.skipif(not available("int8-dot"), reason="no int8-dot kernel on this CPU")
def test_int8_target_gives_the_same_tokens_with_speculation_off_and_on(target_model_dir):
    prompts = PROMPTS[:2]
    engine = make_engine(target_model_dir, quantization="int8")
    assert engine.runner.linear == "int8-dot"
    off = _runs(engine, [(f"o{i}", p, 0, 1, None) for i, p in enumerate(prompts)]
                + [("s-off", prompts[0], 0, 1, SEEDED)])
    engine = make_engine(target_model_dir, quantization="int8", max_num_seqs=8)
    on = _runs(engine, [(f"c{i}", p, 4, 1, None) for i, p in enumerate(prompts)]
               + [(f"t{i}", p, 6, 2, None) for i, p in enumerate(prompts)]
               + [("s-on", prompts[0], 4, 1, SEEDED)])
    assert on[0] == off[0] and on[1] == off[1]  # chains
    assert on[2] == off[0] and on[3] == off[1]  # trees
    assert on[4] == off[2]  # seeded sampling
    assert engine.stats.method("ngram").greedy.drafts > 0


def test_int8_is_refused_where_its_product_cannot_run(monkeypatch):
    cpu = torch.device("cpu")
    assert quantization.linear_backend("auto", "none", cpu, torch.float32) == "auto"
    with pytest.raises(StartupError, match="CPU with float32"):
        quantization.linear_backend("auto", "int8", cpu, torch.bfloat16)
    with pytest.raises(StartupError, match="CPU with float32"):
        quantization.linear_backend("auto", "int8", torch.device("meta"), torch.float32)
    monkeypatch.setattr(quantization, "available", lambda backend: False)
    monkeypatch.setattr(quantization.int8_dot, "why_unavailable", lambda: "no C++ compiler")
    with pytest.raises(StartupError, match="cannot run here: no C.. compiler"):
        quantization.linear_backend("auto", "int8", cpu, torch.float32)


def test_int8_clashing_flags_are_named_before_the_model_loads():
    assert not config_problems(VerifierConfig(quantization="int8"))
    problems = config_problems(VerifierConfig(quantization="int8", linear="fp16-dot",
                                              tensor_parallel_size=2))
    assert any("--linear at auto" in p for p in problems)
    assert any("--tensor-parallel-size must be 1" in p for p in problems)
