"""Helpers for engine tests: an engine on the test model with in-process proposers."""

from __future__ import annotations

import asyncio
import dataclasses

from proposer_testlib import InProcessProposerClient
from testdata import PROMPTS  # noqa: F401 - re-exported for the engine tests

from proposer_service.base import Proposer
from proposer_service.ngram import NgramProposer
from splitspec.params import GenerationInput, SamplingParams, SpeculationPlan, StoppingCriteria
from verifier_service.config import VerifierConfig
from verifier_service.server import build_engine


def make_engine(model_dir: str, proposers: dict[str, Proposer] | None = None, **overrides):
    # One torch thread: tests share 2 cores with other processes; more threads only contend.
    config = dataclasses.replace(VerifierConfig(model=model_dir, threads=1), **overrides)
    if proposers is None:
        proposers = {"ngram": NgramProposer()}
    clients = {m: InProcessProposerClient(p) for m, p in proposers.items()}
    engine, *_ = build_engine(config, clients)
    return engine


def request(engine, rid: str, prompt: str, max_tokens: int = 24, method: str | None = "ngram",
            k: int = 0, sampling: SamplingParams | None = None, **stop) -> GenerationInput:
    ids = tuple(engine.tokenizer.encode(prompt, add_special_tokens=False))
    return GenerationInput(rid, ids, sampling or SamplingParams(temperature=0.0),
                           StoppingCriteria(max_tokens=max_tokens, **stop),
                           SpeculationPlan(method, k) if k else SpeculationPlan())


def request_ids(rid: str, prompt_ids: list[int], max_tokens: int = 24, k: int = 0,
                method: str = "ngram", sampling: SamplingParams | None = None,
                **stop) -> GenerationInput:
    """A request whose prompt is given as token ids."""
    return GenerationInput(rid, tuple(prompt_ids), sampling or SamplingParams(temperature=0.0),
                           StoppingCriteria(max_tokens=max_tokens, **stop),
                           SpeculationPlan(method, k) if k else SpeculationPlan())


async def stream(engine, inp: GenerationInput) -> list:
    """Every output chunk of a request, as streamed."""
    return [out async for out in engine.generate(inp)]


def drained(engine):
    """The engine's stats once nothing runs or waits and every KV block is free, else None."""
    s = engine.snapshot()
    return s if (s.running == 0 and s.waiting == 0
                 and s.kv_blocks_free == s.kv_blocks_total) else None


async def collect(engine, inp: GenerationInput):
    tokens, text, last = [], "", None
    async for out in engine.generate(inp):
        tokens += out.token_ids
        text += out.text
        last = out
    return tokens, text, last


async def run_all(engine, inputs: list[GenerationInput]):
    """Submit all at once (they share steps) and collect each request's result."""
    engine.start()
    try:
        return await asyncio.gather(*(collect(engine, i) for i in inputs))
    finally:
        await engine.shutdown()


# (method, k, branches): every shape of draft the learned drafters' engine serves, off first
EVERY_DRAFT_SHAPE = [(None, 0, 1), ("ngram", 4, 1), ("ngram", 6, 2), ("suffix", 4, 1),
                     ("draft", 3, 1), ("mlp", 3, 1), ("eagle", 4, 1), ("eagle", 6, 2),
                     ("lookahead", 8, 1), ("hybrid:suffix+eagle", 6, 1)]


def learned_drafters(learned_models) -> dict[str, Proposer]:
    """Every proposer on the learned target, in process: n-gram, suffix, the draft model and
    the MLP speculator (tests that run each method through one engine)."""
    from proposer_service.config import ProposerConfig
    from proposer_service.server import build_proposer
    from proposer_service.suffix import SuffixProposer
    from splitspec.config import parse_config

    target, draft, spec = learned_models
    flags = ["--device", "cpu", "--dtype", "float32"]
    proposers: dict[str, Proposer] = {"ngram": NgramProposer(), "suffix": SuffixProposer()}
    for method, path, extra in (("draft", draft, []), ("mlp", spec, ["--tokenizer", target])):
        proposers[method] = build_proposer(parse_config(ProposerConfig, [
            "--method", method, "--model", path, *flags, *extra]))
    return proposers
