"""Continuous batching on the paged KV cache: mixed speculative batches stay lossless (with the
n-gram, draft and MLP proposers, under preemption and chunked prefill, greedy and seeded
sampled), block accounting survives finishes, cancellations and preemptions, and admission is
first come, first served."""

from __future__ import annotations

import asyncio
import random

import pytest
from engine_testlib import PROMPTS, collect, drained, make_engine, request
from polling import wait_until_async

from splitspec.params import SamplingParams


def _prompts16():
    rng = random.Random(0)
    out = []
    for i in range(16):
        base = PROMPTS[i % len(PROMPTS)]
        out.append(base * (1 + i % 3) + " " * rng.randrange(4))  # different lengths
    return out


def test_16_concurrent_mixed_requests_equal_each_alone_without_speculation(target_model_dir):
    prompts = _prompts16()
    ks = [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 3]
    lengths = [8 + 4 * (i % 5) for i in range(16)]

    async def alone():
        engine = make_engine(target_model_dir)
        engine.start()
        out = [(await collect(engine, request(engine, f"a{i}", p, max_tokens=n)))[0]
               for i, (p, n) in enumerate(zip(prompts, lengths))]
        await engine.shutdown()
        return out

    async def together():
        engine = make_engine(target_model_dir, max_num_seqs=16)
        engine.start()
        res = await asyncio.gather(*(collect(engine, request(engine, f"t{i}", p, max_tokens=n,
                                                             k=k))
                                     for i, (p, n, k) in enumerate(zip(prompts, lengths, ks))))
        steps = engine.stats.steps
        await engine.shutdown()
        return [r[0] for r in res], steps

    ref = asyncio.run(alone())
    got, steps = asyncio.run(together())
    assert got == ref
    assert steps < sum(lengths) / 4  # they really shared steps


def test_kv_blocks_return_to_total_after_200_requests_with_cancels_and_preemption(
        target_model_dir):
    # A cache of 40 blocks x 4 tokens cannot hold 8 running requests of up to ~90 tokens:
    # preemption is forced. A quarter of the requests are cancelled mid-stream.
    engine = make_engine(target_model_dir, max_num_seqs=8, block_size=4, num_kv_blocks=40,
                         max_waiting=256)
    rng = random.Random(7)

    async def one(i: int):
        prompt = PROMPTS[rng.randrange(len(PROMPTS))][:rng.randrange(5, 60)]
        n = rng.randrange(1, 40)
        inp = request(engine, f"r{i}", prompt, max_tokens=n, k=rng.choice([0, 0, 2, 5]),
                      sampling=SamplingParams(temperature=rng.choice([0.0, 1.0]), seed=i))
        cancel_after = rng.randrange(1, 4) if rng.random() < 0.25 else None
        got, chunks = 0, 0
        gen = engine.generate(inp)
        try:
            async for out in gen:
                got += len(out.token_ids)
                chunks += 1
                if cancel_after is not None and chunks >= cancel_after and not out.finish_reason:
                    return "cancelled", got
                if out.finish_reason:
                    return out.finish_reason, got
        finally:
            await gen.aclose()  # leaving early aborts the request
        return "lost", got

    async def scenario():
        engine.start()
        results = []
        for wave in range(5):  # 200 requests in waves of 40
            results += await asyncio.gather(*(one(40 * wave + i) for i in range(40)))
        # The last cancellations are reaped by the engine loop: wait for it, with a deadline.
        stats = await wait_until_async(lambda: drained(engine), 30,
                                       message="every KV block free again")
        await engine.shutdown()
        return results, stats

    results, stats = asyncio.run(scenario())
    assert len(results) == 200 and not any(r == "lost" for r, _ in results)
    assert {r for r, _ in results} <= {"length", "stop", "cancelled"}
    assert stats.preemptions > 0, "the tiny cache should have forced preemption"
    assert stats.kv_blocks_free == stats.kv_blocks_total == 40
    assert stats.running == 0 and stats.waiting == 0
    assert engine.scheduler.running == [] and len(engine.scheduler.waiting) == 0


def test_preempted_requests_still_produce_the_same_greedy_output(target_model_dir):
    prompts = _prompts16()[:8]

    async def run(**cfg):
        engine = make_engine(target_model_dir, **cfg)
        engine.start()
        res = await asyncio.gather(*(collect(engine, request(engine, f"p{i}", p, max_tokens=40,
                                                             k=i % 4))
                                     for i, p in enumerate(prompts)))
        pre = engine.scheduler.num_preemptions
        await engine.shutdown()
        return [r[0] for r in res], pre

    roomy, _ = asyncio.run(run(max_num_seqs=8))
    tight, preemptions = asyncio.run(run(max_num_seqs=8, block_size=4, num_kv_blocks=45))
    assert preemptions > 0 and tight == roomy


def test_chunked_prefill_keeps_outputs_and_lets_decodes_progress(target_model_dir):
    long_prompt = PROMPTS[0] * 12  # a few hundred tokens

    async def run(budget: int):
        engine = make_engine(target_model_dir, max_num_batched_tokens=budget)
        engine.start()
        log: list[tuple[str, int]] = []  # (request, engine step) per output chunk

        async def consume(name, inp):
            tokens = []
            async for out in engine.generate(inp):
                tokens += out.token_ids
                log.append((name, engine.stats.steps))
            return tokens

        short = asyncio.create_task(consume("short", request(engine, "s", PROMPTS[1],
                                                             max_tokens=40, k=2)))
        await wait_until_async(lambda: log, 30, 0.001, "the short request's first token")
        submitted = engine.stats.steps
        long_tokens = await consume("long", request(engine, "l", long_prompt, max_tokens=8, k=3))
        short_tokens = await short
        await engine.shutdown()
        first_long = next(step for name, step in log if name == "long")
        during = sum(1 for name, step in log if name == "short" and submitted < step < first_long)
        return short_tokens, long_tokens, during

    s0, l0, during0 = asyncio.run(run(0))
    s1, l1, during1 = asyncio.run(run(16))
    assert (s1, l1) == (s0, l0)
    assert during1 >= 3 > during0  # the short request kept decoding while the prompt was chunked


def test_seeded_sampled_requests_under_preemption_equal_each_alone(target_model_dir):
    """A seeded request draws from its own generator: preempted (its blocks freed, its tokens
    recomputed) and re-admitted, it still samples exactly what it samples alone."""
    prompts = _prompts16()[:8]
    ks = [i % 4 for i in range(8)]  # speculation off and on (n-gram, k 1..3)

    def inputs(engine):
        return [request(engine, f"s{i}", p, max_tokens=24, k=k,
                        sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i))
                for i, (p, k) in enumerate(zip(prompts, ks))]

    async def alone():
        engine = make_engine(target_model_dir)
        engine.start()
        out = [(await collect(engine, inp))[0] for inp in inputs(engine)]
        await engine.shutdown()
        return out

    async def tight():
        engine = make_engine(target_model_dir, max_num_seqs=8, block_size=4, num_kv_blocks=45)
        engine.start()
        res = await asyncio.gather(*(collect(engine, inp) for inp in inputs(engine)))
        stats = await wait_until_async(lambda: drained(engine), 30,
                                       message="every KV block free again")
        await engine.shutdown()
        return [r[0] for r in res], stats

    ref = asyncio.run(alone())
    got, stats = asyncio.run(tight())
    assert stats.preemptions > 0, "the tiny cache should have forced preemption"
    assert got == ref


def test_chunked_prefill_keeps_seeded_sampled_outputs(target_model_dir):
    """Prompts prefilled in 16-token chunks sample exactly what they sample prefilled whole."""
    prompts = [PROMPTS[0] * 12, PROMPTS[1], PROMPTS[4] * 6]
    ks = [3, 0, 2]

    async def run(budget: int):
        engine = make_engine(target_model_dir, max_num_batched_tokens=budget)
        engine.start()
        res = await asyncio.gather(*(
            collect(engine, request(engine, f"c{i}", p, max_tokens=24, k=k,
                                    sampling=SamplingParams(temperature=0.9, top_p=0.95,
                                                            seed=7 + i)))
            for i, (p, k) in enumerate(zip(prompts, ks))))
        steps = engine.snapshot().steps
        await engine.shutdown()
        return [r[0] for r in res], steps

    whole, whole_steps = asyncio.run(run(0))
    chunked, chunked_steps = asyncio.run(run(16))
    assert chunked == whole
    # the long prompts (hundreds of tokens) really went in 16-token chunks
    assert chunked_steps >= whole_steps + 10


@pytest.fixture(scope="module")
def learned(learned_models):
    """A sharpened tiny target with a draft and an MLP speculator fitted to it, the proposers
    built from their command-line flags."""
    from proposer_service.config import ProposerConfig
    from proposer_service.server import build_proposer
    from splitspec.config import parse_config

    target, draft, spec = learned_models
    flags = ["--device", "cpu", "--dtype", "float32"]
    proposers = {
        "draft": build_proposer(parse_config(ProposerConfig, [
            "--method", "draft", "--model", draft, *flags])),
        "mlp": build_proposer(parse_config(ProposerConfig, [
            "--method", "mlp", "--model", spec, "--tokenizer", target, *flags])),
    }
    return target, proposers


def test_preemption_with_draft_and_mlp_proposers_keeps_greedy_output_and_leaks_no_block(
        learned):
    target, proposers = learned
    prompts = _prompts16()[:8]
    plans = [("draft", 4), ("mlp", 3), ("draft", 2), ("mlp", 4),
             ("draft", 6), ("mlp", 2), ("draft", 3), ("mlp", 1)]

    async def run(speculate: bool, **cfg):
        engine = make_engine(target, proposers=proposers, max_num_seqs=8, **cfg)
        engine.start()
        res = await asyncio.gather(*(
            collect(engine, request(engine, f"l{i}", p, max_tokens=40, method=m,
                                    k=k if speculate else 0))
            for i, (p, (m, k)) in enumerate(zip(prompts, plans))))
        stats = await wait_until_async(lambda: drained(engine), 30,
                                       message="every KV block free again")
        await engine.shutdown()
        return res, stats

    off, _ = asyncio.run(run(False))
    on, stats = asyncio.run(run(True, block_size=4, num_kv_blocks=48))
    assert stats.preemptions > 0, "the tiny cache should have forced preemption"
    assert [r[0] for r in on] == [r[0] for r in off]
    for method in ("draft", "mlp"):
        usages = [r[2].usage for r, (m, _) in zip(on, plans) if m == method]
        assert sum(u.proposed_tokens for u in usages) > 0, method  # drafts were verified
        assert sum(u.accepted_tokens for u in usages) > 0, method
    assert stats.kv_blocks_free == stats.kv_blocks_total


def admitted(engine) -> int:
    """Requests the engine has taken: finished, running or waiting."""
    s = engine.snapshot()
    return s.finished_requests + s.running + s.waiting


def test_waiting_requests_are_admitted_in_arrival_order(target_model_dir):
    """One running slot: queued requests start (and so finish) in the order they arrived."""
    engine = make_engine(target_model_dir, max_num_seqs=1)
    started: list[int] = []

    async def one(i: int):
        n = 60 if i == 0 else 3  # the first one runs while the others queue behind it
        async for _ in engine.generate(request(engine, f"f{i}", PROMPTS[i], max_tokens=n, k=2)):
            if i not in started:
                started.append(i)

    async def scenario():
        engine.start()
        tasks = []
        for i in range(5):  # arrive one after the other, each queued behind the one before
            tasks.append(asyncio.create_task(one(i)))
            await wait_until_async(lambda: admitted(engine) == i + 1, 30,
                                   message="the request queued")
        await asyncio.gather(*tasks)
        await engine.shutdown()

    asyncio.run(scenario())
    assert started == [0, 1, 2, 3, 4]
