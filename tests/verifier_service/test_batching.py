"""Continuous batching on the paged KV cache: mixed speculative batches stay lossless, and
block accounting survives finishes, cancellations and preemptions."""

from __future__ import annotations

import asyncio
import random

from engine_testlib import PROMPTS, collect, make_engine, request
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
        await asyncio.sleep(0.05)  # let the loop reap the last aborts
        stats = engine.snapshot()
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
        while not log:
            await asyncio.sleep(0.001)
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
