"""Checks for prefix caching (verifier_service/batching/prefix_cache.py), shared by its tests and
their planted-bug controls.

`check_lossless` serves a seed request, then a wave of requests whose prompts share no block,
one block, many blocks, the seed's whole prompt, blocks of the seed's answer (a second chat
turn), a prefix shifted by a block, and the seed's prompt under another cache salt; greedy and
seeded T 0.8 of each, in one mixed batch over a cache small enough that blocks are evicted and
sequences preempted. It holds the engine to:

  - every output equal to speculation off with caching off (token for token);
  - no request finding more cached tokens than another request's computed tokens can give it
    (whole blocks of a common prefix with the same salt, at least one token left to compute),
    and some finding them;
  - every block the cache holds for a served sequence's prefix holding exactly the keys and
    values a fresh prefill of that prefix computes;
  - held + cached free + free = all blocks, with nothing held at the end.
"""

from __future__ import annotations

import asyncio
import dataclasses

import torch
from engine_testlib import collect, make_engine, request_ids, run_all

from splitspec.params import SamplingParams
from verifier_service.kv.prefix import extend_keys, root_key

BLOCK = 4
SEED_LEN = 26  # the seed prompt's tokens: 6 full blocks and a partial one


def prompts(vocab: int) -> dict[str, tuple[list[int], str | None]]:
    """name -> (prompt ids, cache salt), around the seed prompt `base`; the "turn2" prompt is
    completed with the seed's answer when the seed has run."""
    base = [(7 * i + 3) % (vocab - 10) + 5 for i in range(SEED_LEN)]
    other = [(11 * i + 1) % (vocab - 10) + 5 for i in range(18)]
    return {
        "seed": (base, None),
        "salted": (list(base), "tenant-b"),  # first: the seed's blocks are all still cached
        "none": (other, None),
        "one": (base[:BLOCK] + other[:9], None),
        "many": (base[:20] + other[:7], None),
        "partial": (base[:22] + other[3:10], None),  # 5 blocks + 2 tokens of the 6th
        "whole": (list(base), None),
        "turn2": (list(base), None),  # + the seed's answer and a new question
        "shifted": (base[:BLOCK] + base[2 * BLOCK:SEED_LEN], None),  # block 2 at block 1's place
    }


def _inputs(prompt_map, seed_answer, method, k, branches, max_tokens):
    out = []
    for name, (ids, salt) in prompt_map.items():
        if name == "seed":
            continue
        if name == "turn2":  # a second chat turn: the first one's answer, and more
            ids = ids + seed_answer[:10] + [9, 10, 11]
        for mode, sampling in (("g", SamplingParams(temperature=0.0)),
                               ("s", SamplingParams(temperature=0.8, seed=sum(map(ord, name))))):
            inp = request_ids(f"{name}-{mode}", ids, max_tokens=max_tokens,
                              method=method or "ngram", k=k if method else 0, sampling=sampling)
            if branches > 1:
                inp = dataclasses.replace(inp, speculation=dataclasses.replace(
                    inp.speculation, num_branches=branches))
            # salted: a tenant of its own per request (no other request can share its blocks)
            out.append(dataclasses.replace(inp, cache_salt=salt and f"{salt}-{mode}"))
    return out


async def _serve(engine, seed, wave):
    engine.start()
    try:
        first = await collect(engine, seed)
        rest = await asyncio.gather(*(collect(engine, i) for i in wave))
        return [first, *rest]
    finally:
        await engine.shutdown()


def reference(model_dir: str, max_tokens: int = 20) -> dict[str, list[int]]:
    """Each request's tokens with speculation and caching off."""
    engine = make_engine(model_dir, proposers={}, enable_prefix_caching=False)
    pm = prompts(engine.runner.vocab_size)
    seed = request_ids("seed", pm["seed"][0], max_tokens=max_tokens)
    (seed_out, _, _), = asyncio.run(run_all(engine, [seed]))
    engine = make_engine(model_dir, proposers={}, enable_prefix_caching=False)
    wave = _inputs(pm, seed_out, None, 0, 1, max_tokens)
    got = asyncio.run(run_all(engine, wave))
    return {"seed": seed_out} | {i.request_id: t for i, (t, _, _) in zip(wave, got)}


def prefix_kv(model_dir: str, sequences: list[list[int]]) -> list[tuple[torch.Tensor, ...]]:
    """(keys, values) [layers, n, kv heads, head dim] a fresh prefill of each token list
    computes (caching off), for its positions 0 .. n - 1."""
    engine = make_engine(model_dir, proposers={}, enable_prefix_caching=False, block_size=BLOCK)
    kv, got = engine.runner.kv, {}
    remove = engine.scheduler.remove

    def keep_rows(seq):
        n = len(seq.inp.prompt_token_ids) - 1
        slots = kv.slots(seq.blocks, 0, n)
        got[seq.request_id] = (kv.k[:, slots].clone(), kv.v[:, slots].clone())
        remove(seq)

    engine.scheduler.remove = keep_rows
    asyncio.run(run_all(engine, [request_ids(f"r{i}", s + [5], max_tokens=1)
                                 for i, s in enumerate(sequences)]))
    return [got[f"r{i}"] for i in range(len(sequences))]


def _bound(tokens: list[int], salt, others: list[tuple[list[int], object]]) -> int:
    """The most cached tokens a prompt can find: whole blocks of a common prefix with another
    served sequence's computed tokens under the same salt, one token left to compute."""
    best = 0
    for seen, seen_salt in others:
        if seen_salt != salt:
            continue
        n = 0
        while n < len(tokens) - 1 and n < len(seen) and tokens[n] == seen[n]:
            n += 1
        best = max(best, n)
    return min(best, len(tokens) - 1) // BLOCK * BLOCK


def check_lossless(model_dir: str, want: dict[str, list[int]], method: str | None, k: int,
                   branches: int = 1, proposers=None, max_tokens: int = 20,
                   expect_hits: bool = True, **config) -> None:
    engine = make_engine(model_dir, proposers=proposers if proposers is not None else {},
                         block_size=BLOCK, num_kv_blocks=48, max_num_seqs=6, **config)
    pm = prompts(engine.runner.vocab_size)
    seed = request_ids("seed", pm["seed"][0], max_tokens=max_tokens, method=method or "ngram",
                       k=k if method else 0)
    if branches > 1:
        seed = dataclasses.replace(seed, speculation=dataclasses.replace(
            seed.speculation, num_branches=branches))
    wave = _inputs(pm, want["seed"], method, k, branches, max_tokens)
    results = asyncio.run(_serve(engine, seed, wave))
    inputs = [seed, *wave]
    got = {i.request_id: t for i, (t, _, _) in zip(inputs, results)}
    assert got == want, [n for n in want if got[n] != want[n]]

    # what each served sequence computed (prompt + answer but its last token), and its salt
    served = [(list(i.prompt_token_ids) + got[i.request_id][:-1], i.cache_salt)
              for i in inputs]
    cached = {i.request_id: last.usage.cached_tokens for i, (_, _, last) in zip(inputs, results)}
    for n, inp in enumerate(inputs):
        others = served[:n] + served[n + 1:]
        bound = _bound(list(inp.prompt_token_ids), inp.cache_salt, others)
        assert cached[inp.request_id] <= bound, (inp.request_id, cached[inp.request_id], bound)
    assert cached["seed"] == 0
    if method == "eagle":  # a head that restored its rows drafts on a hit as without one
        drafted = {i.request_id: last.usage.proposed_tokens
                   for i, (_, _, last) in zip(inputs, results)}
        assert all(drafted[r] > 0 for r, n in cached.items() if n), (cached, drafted)
    stats = engine.prefix.stats
    assert stats.queries > 0
    if expect_hits:
        assert stats.hits > 0 and sum(cached.values()) > 0, cached

    # every block the cache holds for a served prefix holds that prefix's keys and values
    kv, model = engine.runner.kv, engine.config.model
    found = []
    for tokens, salt in served:
        keys = extend_keys([], root_key(model, salt), tokens, BLOCK, len(tokens))
        blocks = kv.lookup(keys)
        if blocks:
            found.append((tokens[:len(blocks) * BLOCK], blocks))
    assert found, "nothing of what was served is cached"
    ref = prefix_kv(model_dir, [t for t, _ in found])
    for (_, blocks), (rk, rv) in zip(found, ref):
        slots = torch.tensor([b * BLOCK + j for b in blocks for j in range(BLOCK)])
        torch.testing.assert_close(kv.k[:, slots], rk, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(kv.v[:, slots], rv, atol=1e-4, rtol=1e-4)

    held, cached_free, free = kv.allocator.accounting()
    assert held == 0 and cached_free + free == kv.num_blocks
    assert cached_free == kv.allocator.num_cached
    assert engine.drafts.in_target.num_states == 0


def check_hits_served_alone(model_dir: str, want: dict[str, list[int]], method: str | None,
                            k: int, proposers=None) -> int:
    """The seed, then each greedy request whose prompt shares blocks with it, one at a time: a
    lone sequence over the cached prefix's blocks and its own (attention over several runs of
    slots). Each output equal to speculation off with caching off, each request a hit.
    Returns how many times attention read a context run by run (the paged attention function,
    or the CPU step kernels' contexts of several runs)."""
    import verifier_service.kv.cpu_attention as cpu_attention
    import verifier_service.kv.paged_attention as paged_attention

    engine = make_engine(model_dir, proposers=proposers if proposers is not None else {},
                         block_size=BLOCK, num_kv_blocks=48, max_num_seqs=6)
    pm = prompts(engine.runner.vocab_size)
    names = ("one", "many", "partial", "whole", "turn2")
    inputs = [request_ids("seed", pm["seed"][0], max_tokens=len(want["seed"]))] + [
        i for i in _inputs(pm, want["seed"], method, k, 1, len(want["seed"]))
        if i.request_id in {f"{n}-g" for n in names}]
    real, reads = paged_attention.attention_over_runs, []

    def counted(*args, **kwargs):
        reads.append(1)
        return real(*args, **kwargs)

    async def one_at_a_time():
        engine.start()
        try:
            return [await collect(engine, i) for i in inputs]
        finally:
            await engine.shutdown()

    real_runs = cpu_attention.slot_runs

    def runs_counted(*args):
        runs = real_runs(*args)
        if len(runs) > 1:
            reads.append(1)
        return runs

    paged_attention.attention_over_runs = counted
    cpu_attention.slot_runs = runs_counted
    try:
        results = asyncio.run(one_at_a_time())
    finally:
        paged_attention.attention_over_runs = real
        cpu_attention.slot_runs = real_runs
    got = {i.request_id: t for i, (t, _, _) in zip(inputs, results)}
    assert got == {i.request_id: want[i.request_id] for i in inputs}
    assert all(last.usage.cached_tokens > 0 for _, _, last in results[1:])
    return len(reads)
