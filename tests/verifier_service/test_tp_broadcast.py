"""What rank 0 of a tensor-parallel verifier sends the other ranks (verifier_service/
tp/broadcast.py, kv/journal.py): a plan comes out as it went in (exact, tree and bucket steps, with
the cache journal), a message longer than the buffer grows it on both sides, and, over a whole
engine run
with the ranks as threads of this process (tests/tp_testlib.py):

- every step costs exactly one broadcast (a journal sent apart fails the count);
- the other ranks repeat rank 0's cache operations, so that greedy output with speculation
  equals plain output at TP 1 when kept rows move (trees whose second child is always the
  target's token, test_tree_engine.py's oracle; lookahead's scratch rows), and a follower that
  drops the moves fails it (tests/planted_bugs.py).
"""

from __future__ import annotations

import asyncio

import planted_bugs as bug
import pytest
import torch
from engine_testlib import PROMPTS, make_engine, request, request_ids, run_all
from test_tree_engine import NAME, OracleTree, _tree
from tp_testlib import ThreadRanks, serve_in_threads

from kernels.layout import StepLayout
from splitspec.methods import METHODS, Capabilities, Kind, MethodSpec
from verifier_service.kv.cache import BlockTable, KVCacheSpec, PagedKVCache
from verifier_service.kv.journal import JournaledKVCache, replay_journal
from verifier_service.step.plan import BucketLadder, plan_step
from verifier_service.tp.broadcast import (
    STEP,
    STOP,
    PlanReceiver,
    _Channel,
    decode,
    encode,
)

BS = 4


def _plans():
    """An exact chain step, an exact tree step (ancestors), a bucket step."""
    chain = StepLayout.build([4, 1], [3, 7], [3, 0], [True, True])
    tree = StepLayout.build([4, 3], [13, 6], [3, 2], [True, True], [None, [-1, -1]])
    tables = [[0, 1, 2, 3, 4], [5, 6, 7]]
    yield plan_step(chain, [5, 6, 7, 8, 9], tables, BS, 24)
    yield plan_step(tree, [5, 6, 7, 8, 9, 10, 11], tables, BS, 24)
    yield plan_step(StepLayout.build([4, 3], [13, 6], [3, 2], [True, True]),
                    [5, 6, 7, 8, 9, 10, 11], tables, BS, 24, BucketLadder((1, 4), (1, 4)),
                    max_blocks=8)


@pytest.mark.parametrize("index", [0, 1, 2], ids=["chain", "tree", "bucket"])
def test_a_plan_comes_out_as_it_went_in(index):
    plan = list(_plans())[index]
    journal = torch.tensor([1, 2, 7, 9, 2, 1, 40, 44]).numpy()
    msg = decode(torch.from_numpy(encode(STEP, plan, journal)))
    got = msg.plan
    assert msg.op == STEP and msg.journal.tolist() == journal.tolist()
    assert got.fields == plan.fields and torch.equal(got.host, plan.host)
    assert (got.bucket, got.block_size, got.max_context, got.context_range) == \
        (plan.bucket, plan.block_size, plan.max_context, plan.context_range)
    assert (got.ancestors is None) == (plan.ancestors is None)
    if plan.ancestors is not None:
        assert torch.equal(got.ancestors, plan.ancestors.bool())
    assert (index == 2) == (plan.bucket is not None)


def test_a_long_message_grows_the_buffer_on_both_sides():
    sent = [torch.arange(n, dtype=torch.int64).numpy() for n in (50, 300, 70, 1000, 200)]
    for m in sent:
        m[1] = len(m)  # the length field a message carries

    def rank(r, group):
        channel = _Channel(group, capacity=64)
        if r == 0:
            for m in sent:
                channel.send(m)
            return channel.capacity, dict(group.counts)
        got = [channel.receive().clone().numpy() for _ in sent]
        return channel.capacity, got

    (cap0, counts), (cap1, got) = ThreadRanks(2).run(rank)
    assert all((a == b).all() for a, b in zip(got, sent))
    assert cap0 == cap1 == 1024
    assert counts["broadcast"] == 7  # 300 and 1000 went out in two parts; the rest in one


def test_the_follower_repeats_zeroing_and_moves():
    spec = KVCacheSpec(2, 2, 4, torch.float32, BS, 10)
    lead, follower = JournaledKVCache(spec, torch.device("cpu")), PagedKVCache(
        spec, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    for kv in (lead, follower):
        kv.k.copy_(torch.randn(kv.k.shape, generator=g.manual_seed(1)))
        kv.v.copy_(torch.randn(kv.v.shape, generator=g.manual_seed(2)))
    table = BlockTable()
    lead.reserve(table, 9)  # zeroes 3 blocks; the next step's message carries it
    replay_journal(follower, lead.take_journal())
    for kv in (lead, follower):  # the step writes its rows (each rank into its own shard)
        kv.k[:, :9] += torch.arange(9.0)[:, None, None]
    lead.keep(table, 0, [0, 1, 4, 6])  # a tree's path: rows 4 and 6 move to 2 and 3
    replay_journal(follower, lead.take_journal())
    assert torch.equal(follower.k, lead.k) and torch.equal(follower.v, lead.v)
    assert torch.equal(lead.k[:, 2], follower.k[:, 4]) and lead.take_journal().size == 0


# -- whole engine runs, ranks as threads --------------------------------------------------------


@pytest.fixture(scope="module")
def greedy_off(target_model_dir):
    """The toy target's greedy output (speculation off, TP 1) of three prompts, and the
    reference the oracle tree drafts from (tests/verifier_service/test_tree_engine.py)."""
    engine = make_engine(target_model_dir)
    res = asyncio.run(run_all(engine, [request(engine, f"b{i}", p, max_tokens=28, k=0)
                                       for i, p in enumerate(PROMPTS[:3])]))
    ids = [tuple(engine.tokenizer.encode(p, add_special_tokens=False)) for p in PROMPTS[:3]]
    return [r[0] for r in res], dict(zip(ids, (r[0] for r in res)))


@pytest.fixture
def oracle(monkeypatch):
    """test_tree_engine.py's oracle tree, registered as an in-target method."""
    monkeypatch.setitem(METHODS, NAME, MethodSpec(
        NAME, "a tree around the true continuation", "test_tree_engine:OracleTree",
        Capabilities(), kind=Kind.IN_TARGET))
    monkeypatch.setattr(OracleTree, "mangle", None)
    return OracleTree


def _requests(engine):
    """A tree whose second child is always the true token (kept rows move every step),
    lookahead (scratch rows), an n-gram chain and plain decoding, in one batch."""
    return [_tree(engine, "tree", PROMPTS[0], max_tokens=24),
            request(engine, "lookahead", PROMPTS[1], max_tokens=24, method="lookahead", k=8),
            request(engine, "chain", PROMPTS[2], max_tokens=24, k=4)]


def check_tp2_serves_what_tp1_serves(model_dir, greedy_off, monkeypatch) -> None:
    moves = []
    original = JournaledKVCache._move
    monkeypatch.setattr(JournaledKVCache, "_move",
                        lambda self, s, d: (moves.append(len(s)), original(self, s, d)))
    outs, engine, group, follower_steps = serve_in_threads(model_dir, _requests)
    assert len(moves) >= 3  # kept rows did move
    assert follower_steps == [engine.stats.steps]
    for (tokens, _, _), off in zip(outs, greedy_off[0]):
        assert tokens == off[:24]
    assert outs[0][2].usage.branch_hits > 0


def test_tp2_over_threads_serves_what_tp1_serves(target_model_dir, greedy_off, oracle,
                                                 monkeypatch):
    oracle.reference = greedy_off[1]
    check_tp2_serves_what_tp1_serves(target_model_dir, greedy_off, monkeypatch)


def test_the_check_catches_a_follower_that_drops_the_moves(target_model_dir, greedy_off, oracle,
                                                           monkeypatch):
    oracle.reference = greedy_off[1]
    bug.tp_follower_drops_moves(monkeypatch)
    with pytest.raises(AssertionError):
        check_tp2_serves_what_tp1_serves(target_model_dir, greedy_off, monkeypatch)


def check_one_broadcast_per_step(model_dir) -> None:
    """Rank 0 an engine at TP 1 arithmetic whose executor broadcasts (what the host sends is
    independent of the sharding); rank 1 only counts the messages."""
    from verifier_service.tp.broadcast import PlanBroadcast

    def rank(r, group):
        if r == 0:
            engine = make_engine(model_dir)
            kv = engine.runner.kv
            journaled = JournaledKVCache(kv.spec, kv.k.device)
            engine.runner.kv = engine.scheduler.kv = engine.executor.kv = journaled
            engine.prefix.kv = journaled
            engine.executor.broadcast = PlanBroadcast(group, journaled)
            try:
                asyncio.run(run_all(engine, _plain_requests(engine)))
            finally:
                engine.executor.broadcast.stop()
            return engine.stats.steps, group.counts["broadcast"]
        receiver, messages = PlanReceiver(group), 0
        while receiver.next().op != STOP:
            messages += 1
        return messages, group.counts["broadcast"]

    (steps, sent), (received, _) = ThreadRanks(2).run(rank)
    assert steps > 10
    assert sent == steps + 1  # one per step, and the stop
    assert received == steps


def _plain_requests(engine):
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 1024, (n,), generator=g).tolist() * 3 for n in (4, 7)]
    return [request_ids(f"{name}{i}", p, 12, k=k, method=method, ignore_eos=True)
            for name, k, method in (("off", 0, "ngram"), ("chain", 3, "ngram"),
                                    ("la", 6, "lookahead"))
            for i, p in enumerate(prompts)]


def test_every_step_is_one_broadcast(tiny_target_dir):
    check_one_broadcast_per_step(tiny_target_dir)


def test_the_check_catches_a_journal_sent_apart(tiny_target_dir, monkeypatch):
    bug.tp_journal_sent_apart(monkeypatch)
    with pytest.raises(AssertionError):
        check_one_broadcast_per_step(tiny_target_dir)
