"""Prefix caching in the engine (verifier_service/batching/prefix_cache.py): with caching on,
every method (chains, trees, lookahead, EAGLE, the draft model, the MLP speculator) gives the
output of speculation off with caching off, greedy and seeded, over prompts that share no block,
one, many, a partial last block, the whole prompt, an earlier answer, under another salt, and
through preemption and eviction (tests/verifier_service/prefix_testlib.py says what is held)."""

from __future__ import annotations

import asyncio
import random

import planted_bugs as bug
import pytest
from engine_testlib import make_engine, request_ids, run_all
from prefix_testlib import check_hits_served_alone, check_lossless, reference

from proposer_service.ngram import NgramProposer


@pytest.fixture(scope="module")
def learned(learned_models):
    from proposer_service.config import ProposerConfig
    from proposer_service.server import build_proposer
    from splitspec.config import parse_config

    target, draft, spec = learned_models
    flags = ["--device", "cpu", "--dtype", "float32"]
    return target, {
        "draft": build_proposer(parse_config(ProposerConfig, [
            "--method", "draft", "--model", draft, *flags])),
        "mlp": build_proposer(parse_config(ProposerConfig, [
            "--method", "mlp", "--model", spec, "--tokenizer", target, *flags])),
    }


@pytest.fixture(scope="module")
def want(learned):
    return reference(learned[0])


@pytest.mark.parametrize("method, k, branches", [
    (None, 0, 1), ("ngram", 3, 1), ("ngram", 4, 2), ("lookahead", 8, 1), ("draft", 3, 1),
    ("mlp", 3, 1)], ids=["off", "ngram-chain", "ngram-tree", "lookahead", "draft", "mlp"])
def test_caching_on_gives_the_output_of_caching_off(learned, want, method, k, branches):
    target, proposers = learned
    chosen = {method: proposers[method]} if method in proposers else {}
    if method == "ngram":
        chosen = {"ngram": NgramProposer()}
    check_lossless(target, want, method, k, branches, proposers=chosen)


@pytest.mark.parametrize("method, k", [(None, 0), ("ngram", 3)], ids=["off", "ngram-chain"])
def test_a_hit_served_alone_reads_its_runs_and_gives_the_output_of_caching_off(learned, want,
                                                                              method, k):
    proposers = {"ngram": NgramProposer()} if method else {}
    assert check_hits_served_alone(learned[0], want, method, k, proposers) > 0


def test_the_lone_hit_check_fails_when_a_run_is_read_one_slot_late(monkeypatch, learned, want):
    bug.run_read_one_slot_late(monkeypatch)
    with pytest.raises(AssertionError):
        check_hits_served_alone(learned[0], want, None, 0, {})


@pytest.mark.parametrize("k, branches", [(3, 1), (6, 2)], ids=["chain", "tree"])
def test_eagle_on_cached_blocks_restores_its_rows(learned, want, learned_eagle_head, k,
                                                  branches):
    check_lossless(learned[0], want, "eagle", k, branches, eagle=learned_eagle_head)


@pytest.mark.parametrize("plant", [
    bug.prefix_key_without_parent, bug.prefix_cache_ignores_the_salt,
    bug.prefix_commit_past_the_kept_rows, bug.prefix_hit_rewrites_the_last_shared_row,
    bug.cached_block_handed_out_while_held,
], ids=["key-without-parent", "salt-ignored", "draft-row-cached", "rollback-into-shared",
        "held-block-handed-out"])
def test_the_check_fails_on_the_planted_bug(monkeypatch, learned, want, plant):
    plant(monkeypatch)
    # the check's assertions, or the engine's own guards failing the requests
    with pytest.raises((AssertionError, ValueError, RuntimeError)):
        check_lossless(learned[0], want, "ngram", 3, proposers={"ngram": NgramProposer()})


def test_eviction_under_pressure_fails_nothing_and_every_block_is_accounted_for(learned):
    """16 concurrent requests, random prompts behind three shared prefixes, over a cache a few
    requests large: all finish with the output of caching off, blocks are evicted and reused,
    and held + cached free + free = all blocks at the end, with nothing held."""
    rng = random.Random(3)
    prefixes = [[rng.randrange(5, 90) for _ in range(n)] for n in (21, 30, 13)]
    prompts = [rng.choice(prefixes) + [rng.randrange(5, 90) for _ in range(rng.randrange(1, 9))]
               for _ in range(16)]

    def serve(**config):
        engine = make_engine(learned[0], proposers={"ngram": NgramProposer()}, block_size=4,
                             max_num_seqs=16, **config)
        got = asyncio.run(run_all(engine, [
            request_ids(f"r{i}", p, max_tokens=12, k=(0, 2, 3)[i % 3])
            for i, p in enumerate(prompts)]))
        return [t for t, _, _ in got], engine

    want, _ = serve(enable_prefix_caching=False)
    got, engine = serve(num_kv_blocks=40)
    assert got == want
    kv = engine.runner.kv
    assert kv.allocator.evictions > 0 and engine.prefix.stats.hits > 0
    held, cached_free, free = kv.allocator.accounting()
    assert held == 0 and cached_free + free == kv.num_blocks


def test_the_eagle_check_fails_when_restored_rows_do_not_line_up(monkeypatch, learned, want,
                                                                  learned_eagle_head):
    bug.eagle_rows_restored_as_blocks(monkeypatch)
    with pytest.raises(AssertionError):
        check_lossless(learned[0], want, "eagle", 3, eagle=learned_eagle_head)
