"""Warm-up before the verifier reports SERVING: everything lazy happens now, not in the first
clients' requests.

    1. graphs   every bucket of the step executor's ladder captured (on a device with graphs;
                the capture runs each bucket's body twice first: Triton kernels compile,
                the allocator grows);
    2. samplers the chain and tree rejection samplers (greedy, sampled and seeded rows, one-hot
                and sparse q) and the log-probability scorer run once on small inputs on the
                target's device (their Triton variants compile where they run);
    3. requests short generations through the engine: a prompt's prefill (on an accelerator
                at several lengths), plain decoding,
                lookahead's token trees greedy and sampled (the in-target method every verifier
                serves), so the decode path of every shape a request starts with has run.

Each part's time goes to the log, and the total: the start-up cost a deployment waits for.
The engine's stats start afresh after it (the dummy prompts' acceptance and step times are no
measurement of served traffic); the process's Prometheus counters keep what they counted.
"""

from __future__ import annotations

import logging
import time
import uuid

import torch

from kernels.layout import StepLayout
from kernels.logprobs import token_logprobs
from kernels.rejection import rejection_sample
from kernels.sampling import SamplingTensors
from kernels.sparse_probs import SparseProbs
from kernels.tree_rejection import tree_rejection_sample
from splitspec.params import GenerationInput, SamplingParams, SpeculationPlan, StoppingCriteria

log = logging.getLogger("splitspec.verifier")


async def warm_up(engine) -> dict[str, float]:
    """Run the warm-up on `engine` (started); returns seconds per part."""
    took: dict[str, float] = {}
    start = time.perf_counter()
    await engine.on_model_thread(engine.executor.capture)
    took["graphs"] = time.perf_counter() - start
    at = time.perf_counter()
    await engine.on_model_thread(warm_samplers, engine.runner.device, engine.runner.vocab_size)
    took["samplers"] = time.perf_counter() - at
    at = time.perf_counter()
    for inp in _requests(engine):
        async for _ in engine.generate(inp):
            pass
    engine.stats.reset()  # dummy prompts: nothing the policy or the step cost should learn from
    took["requests"] = time.perf_counter() - at
    took["total"] = time.perf_counter() - start
    log.info("warm-up took %.2f s (graphs %.2f s, samplers %.2f s, requests %.2f s)",
             took["total"], took["graphs"], took["samplers"], took["requests"])
    return took


def _requests(engine) -> list[GenerationInput]:
    vocab = engine.runner.vocab_size
    prompt = tuple(i % vocab for i in range(3, 11))
    served = engine.drafts.in_target
    k = engine.config.max_num_speculative_tokens

    def one(sampling: SamplingParams, plan: SpeculationPlan, tokens: int) -> GenerationInput:
        return GenerationInput(f"warmup-{uuid.uuid4().hex}", prompt, sampling,
                               StoppingCriteria(max_tokens=tokens, ignore_eos=True), plan)

    out = [one(SamplingParams(temperature=0.0), SpeculationPlan(), 2)]
    if engine.runner.device.type != "cpu":
        # eager prefills at more lengths: Triton specializes integer arguments (a multiple of
        # 16, or not) and the first prefill of a shape plans its kernels; nothing compiles on a
        # CPU. The first requests after start on an H200 ran at 0.1x steady speed (first of
        # each new prompt length) with one 8-token prefill warmed.
        for n in (16, 48, 130):
            out.append(GenerationInput(f"warmup-{uuid.uuid4().hex}",
                                       tuple(i % vocab for i in range(3, 3 + n)),
                                       SamplingParams(temperature=0.0),
                                       StoppingCriteria(max_tokens=2, ignore_eos=True),
                                       SpeculationPlan()))
    if served.serves("lookahead") and k > 0:
        for sampling in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)):
            out.append(one(sampling, SpeculationPlan("lookahead", k), 4))
    return out


def warm_samplers(device: torch.device, vocab: int) -> None:
    """The rejection samplers and the log-probability scorer once each on `device`."""
    g = torch.Generator().manual_seed(0)
    ks = [2, 0, 1]
    layout = StepLayout.for_drafts(ks)
    rows = sum(k + 1 for k in ks)
    probs = torch.softmax(torch.randn(rows, vocab, generator=g), dim=-1).to(device)
    ids = torch.randint(0, vocab, (sum(ks),), generator=g).to(device)
    top = min(4, vocab)
    q = SparseProbs(torch.randint(0, vocab, (sum(ks), top), generator=g),
                    torch.full((sum(ks), top), 1.0 / top)).to(device)
    mixed = [True, False, False]
    seeds = [None, 7, None]
    for draft_q in (None, q):
        rejection_sample(probs, ids, layout, draft_q, mixed, seeds)
        tree_rejection_sample(probs, ids, [[-1, -1], None, None], layout, draft_q, mixed, seeds)
    params = SamplingTensors.from_lists([0.0, 0.8], [0, 5], [1.0, 0.9], [0.0, 0.0])
    token_logprobs(probs[:2].log(), params, ids[:2].cpu(), 2)
