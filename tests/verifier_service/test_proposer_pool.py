"""The proposer pool with in-process members and a fake resolver: placement is sticky and spread,
steps are split and merged, members that die, reconnect, join or leave never cost a sequence its
history, and a pool of two n-gram members drafts exactly what one n-gram proposer drafts."""

from __future__ import annotations

import asyncio
import socket

import pytest
from proposer_testlib import InProcessProposerClient

from proposer_service.ngram import NgramProposer
from splitspec.proposal import SequenceStep
from verifier_service.config import VerifierConfig
from verifier_service.drafts.addresses import resolve_dns, split_target
from verifier_service.drafts.client import ProposerMismatch
from verifier_service.drafts.pool import ProposerPool

TARGET = "ngram-pool.test:50052"


class Member(InProcessProposerClient):
    """An n-gram proposer in this process that can die, come back and record what it heard."""

    def __init__(self, address: str):
        super().__init__(NgramProposer())
        self._address = address
        self.alive = True
        self.closed = False
        self.heard: list[SequenceStep] = []
        self.mismatch = False

    @property
    def address(self) -> str:
        return self._address

    @property
    def connected(self) -> bool:
        return self.alive and not self.closed

    async def ensure_connected(self) -> bool:
        if self.mismatch:
            raise ProposerMismatch(f"{self._address} serves another vocabulary")
        return self.connected

    async def propose(self, steps, timeout_s):
        if not self.connected:
            return None
        self.heard.extend(steps)
        return await super().propose(steps, timeout_s)

    async def close(self) -> None:
        self.closed = True

    def comes_back(self) -> None:
        """Restarted: its state is gone and its stream is a new epoch."""
        self.alive = True
        self.restart(NgramProposer())


class Dns:
    def __init__(self, *addresses: str):
        self.addresses = list(addresses)
        self.failing = False

    async def __call__(self, host: str, port: int) -> list[str]:
        if self.failing:
            raise OSError("temporary failure in name resolution")
        return list(self.addresses)


class Driver:
    """Talks to a proposer client the way the engine does: the full history when the client's
    epoch is not the one the sequence was last sent on, else only the new tokens."""

    def __init__(self, client):
        self.client = client
        self.tokens: dict[str, list[int]] = {}
        self.heard: dict[str, int] = {}
        self.epoch: dict[str, int] = {}

    def add(self, seq_id: str, prompt: list[int]) -> None:
        self.tokens[seq_id], self.heard[seq_id], self.epoch[seq_id] = list(prompt), 0, -1

    async def step(self, k: int = 3) -> dict:
        await self.client.ensure_connected()
        steps = []
        for sid, toks in self.tokens.items():
            full = self.epoch[sid] != self.client.epoch
            new = toks if full else toks[self.heard[sid]:]
            steps.append(SequenceStep(sid, list(new), len(toks), k, full_history=full))
            self.heard[sid], self.epoch[sid] = len(toks), self.client.epoch
        drafts = await self.client.propose(steps, 1.0) or []
        out = {}
        for d in drafts:
            if d.resync:
                self.epoch[d.seq_id] = -1
            out[d.seq_id] = d
        # Each sequence moves on by a token its own history makes repetitive.
        for _sid, toks in self.tokens.items():
            toks.append(toks[len(toks) % 5])
        return out

    def finish(self, seq_id: str) -> None:
        del self.tokens[seq_id]
        self.client.release([seq_id])


def prompts(n: int) -> dict[str, list[int]]:
    return {f"seq-{i}": [(i + j) % 7 + 1 for j in range(12)] for i in range(n)}


def pool_of(dns: Dns, members: dict[str, Member] | None = None, **kwargs) -> ProposerPool:
    members = {} if members is None else members

    def factory(address: str, host: str) -> Member:
        members[address] = Member(address)
        return members[address]

    return ProposerPool("ngram", TARGET, factory, resolve_interval_s=3600, resolver=dns,
                        **kwargs)


async def run_both(pool: ProposerPool, steps: int, n: int = 4, between=None):
    """Drive the pool and a single reference n-gram client side by side; their drafts must be
    equal at every step. `between(step)` may change the pool's members before a step."""
    ref = Driver(InProcessProposerClient(NgramProposer()))
    drv = Driver(pool)
    for sid, p in prompts(n).items():
        ref.add(sid, p)
        drv.add(sid, p)
    for i in range(steps):
        if between is not None:
            await between(i)
        got, want = await drv.step(), await ref.step()
        assert {s: d.tokens for s, d in got.items()} == {s: d.tokens for s, d in want.items()}
        assert not any(d.resync for d in got.values())
    return drv


def test_targets_parse_and_names_resolve_locally():
    assert split_target("a:1,10.0.0.2:50052, [::1]:7") == [("a", 1), ("10.0.0.2", 50052),
                                                         ("::1", 7)]
    for bad in ("a", "a:", ":5", "a:x", "a:70000", "a:1,"):
        with pytest.raises(ValueError):
            split_target(bad)
    # localhost has an IPv4 and maybe an IPv6 address: one process, so one member.
    assert asyncio.run(resolve_dns("localhost", 50052)) == ["127.0.0.1:50052"]
    with pytest.raises(socket.gaierror):
        asyncio.run(resolve_dns("no-such-host.invalid", 1))


def test_sequences_spread_over_members_and_stay_on_theirs():
    async def main():
        members: dict[str, Member] = {}
        pool = pool_of(Dns("10.0.0.1:50052", "10.0.0.2:50052"), members)
        drv = await run_both(pool, steps=5, n=6)
        placed = {sid: pool.placement(sid) for sid in drv.tokens}
        assert sorted(list(placed.values()).count(a) for a in members) == [3, 3]
        for address, member in members.items():
            mine = {s.seq_id for s in member.heard}
            assert mine == {sid for sid, a in placed.items() if a == address}
            # Each sequence: the full history once, then only new tokens.
            for sid in mine:
                fulls = [s.full_history for s in member.heard if s.seq_id == sid]
                assert fulls == [True] + [False] * 4
        assert pool.epoch == 0 and pool.member_stats["10.0.0.1:50052"].steps == 5
        await pool.close()

    asyncio.run(main())


def test_a_dead_member_s_sequences_move_with_their_full_history():
    async def main():
        members: dict[str, Member] = {}
        pool = pool_of(Dns("10.0.0.1:50052", "10.0.0.2:50052"), members)
        a, b = "10.0.0.1:50052", "10.0.0.2:50052"

        async def between(step: int) -> None:
            if step == 3:
                members[a].alive = False

        drv = await run_both(pool, steps=6, between=between)
        assert all(pool.placement(sid) == b for sid in drv.tokens)
        moved = [s for s in members[b].heard if s.full_history]
        assert len(moved) == 4  # two from the start, two moved over from the dead member
        assert all(len(s.new_tokens) == s.history_len for s in moved)
        assert pool.member_stats[b].moved_in == 2 and pool.member_stats[a].moved_in == 0
        assert pool.member_stats[a].missed == 0  # dead before it was asked: never sent to
        assert pool.epoch == 0  # the pool's own epoch never changes
        await pool.close()

    asyncio.run(main())


def test_a_reconnected_member_hears_its_sequences_in_full_again():
    async def main():
        members: dict[str, Member] = {}
        pool = pool_of(Dns("10.0.0.1:50052"), members)
        a = "10.0.0.1:50052"

        async def between(step: int) -> None:
            if step == 2:
                members[a].alive = False  # this step: no member, no drafts
            if step == 3:
                members[a].comes_back()

        ref = Driver(InProcessProposerClient(NgramProposer()))
        drv = Driver(pool)
        for sid, p in prompts(2).items():
            ref.add(sid, p)
            drv.add(sid, p)
        for i in range(5):
            await between(i)
            got, want = await drv.step(), await ref.step()
            if i == 2:
                assert got == {}
            else:
                assert {s: d.tokens for s, d in got.items()} == \
                       {s: d.tokens for s, d in want.items()}
        fulls = [(s.seq_id, s.full_history) for s in members[a].heard]
        assert fulls == [("seq-0", True), ("seq-1", True), ("seq-0", False), ("seq-1", False),
                         ("seq-0", True), ("seq-1", True), ("seq-0", False), ("seq-1", False)]
        await pool.close()

    asyncio.run(main())


def test_resolving_again_adds_and_removes_members():
    async def main():
        members: dict[str, Member] = {}
        dns = Dns("10.0.0.1:50052")
        pool = pool_of(dns, members)
        a, b = "10.0.0.1:50052", "10.0.0.2:50052"
        drv = Driver(pool)
        for sid, p in prompts(2).items():
            drv.add(sid, p)
        await drv.step()
        assert pool.members == [a]

        dns.addresses = [a, b]  # a pod came: old sequences stay, new ones go to it first
        await pool.refresh()
        drv.add("seq-new", prompts(3)["seq-2"])
        await drv.step()
        assert pool.members == [a, b]
        assert [pool.placement(s) for s in ("seq-0", "seq-1", "seq-new")] == [a, a, b]

        dns.failing = True  # a failed lookup keeps what the pool had
        await pool.refresh()
        assert pool.members == [a, b]

        dns.failing, dns.addresses = False, [b]  # a pod went: closed, its sequences move
        await pool.refresh()
        await drv.step()
        assert pool.members == [b] and members[a].closed
        assert all(pool.placement(s) == b for s in drv.tokens)
        assert all(s.full_history for s in members[b].heard if s.seq_id in ("seq-0", "seq-1"))
        await pool.close()

    asyncio.run(main())


def test_release_reaches_the_member_that_holds_the_sequence():
    async def main():
        members: dict[str, Member] = {}
        pool = pool_of(Dns("10.0.0.1:50052", "10.0.0.2:50052"), members)
        drv = Driver(pool)
        for sid, p in prompts(2).items():
            drv.add(sid, p)
        await drv.step()
        holder = members[pool.placement("seq-0")]
        drv.finish("seq-0")
        assert pool.placement("seq-0") is None
        assert holder._released == ["seq-0"]
        await pool.flush_released()
        assert holder._released == []
        # The pool forgot its history too: a delta for it is answered RESYNC.
        d = await pool.propose([SequenceStep("seq-0", [1], 20, 3)], 1.0)
        assert [x.resync for x in d] == [True]
        await pool.close()

    asyncio.run(main())


def test_an_incompatible_member_stops_startup_and_is_left_out_later():
    async def main():
        members: dict[str, Member] = {}
        dns = Dns("10.0.0.1:50052")
        pool = pool_of(dns, members)
        await pool.refresh()
        members["10.0.0.1:50052"].mismatch = True
        with pytest.raises(ProposerMismatch):
            await pool.connect()
        await pool.close()

        members = {}
        pool = pool_of(dns, members)
        await pool.connect()
        dns.addresses = ["10.0.0.1:50052", "10.0.0.2:50052"]
        await pool.refresh()
        bad = members["10.0.0.2:50052"]
        bad.alive, bad.mismatch = False, True
        assert await pool.ensure_connected()
        await asyncio.sleep(0.05)  # the background reconnection runs and refuses it
        bad.alive = True
        drv = Driver(pool)
        for sid, p in prompts(4).items():
            drv.add(sid, p)
        await drv.step()
        assert not bad.heard
        await pool.close()

    asyncio.run(main())


def test_the_engine_speculates_through_a_pool_of_two_with_unchanged_greedy_output(
        tiny_target_dir):
    from engine_testlib import collect, request  # the engine only for this test

    from verifier_service.server import build_engine

    async def main():
        members: dict[str, Member] = {}
        pool = pool_of(Dns("10.0.0.1:50052", "10.0.0.2:50052"), members)
        engine, *_ = build_engine(VerifierConfig(model=tiny_target_dir, threads=1),
                                  {"ngram": pool})
        prompts_ = ["a b a b a b a b", "one two one two one", "x y z x y z x", "q q q q q"]
        base = [request(engine, f"base-{i}", p, max_tokens=16) for i, p in enumerate(prompts_)]
        spec = [request(engine, f"spec-{i}", p, max_tokens=16, k=3)
                for i, p in enumerate(prompts_)]
        engine.start()
        try:
            off = await asyncio.gather(*(collect(engine, r) for r in base))
            on = await asyncio.gather(*(collect(engine, r) for r in spec))
        finally:
            await engine.shutdown()
        assert [t for t, *_ in on] == [t for t, *_ in off]
        assert all(m.heard for m in members.values())
        assert sum(last.usage.proposed_tokens for *_, last in on) > 0
        assert all(pool.placement(r.request_id) is None for r in spec)  # released at the end
        await pool.close()

    asyncio.run(main())


def test_placement_spreads_by_load_then_by_sequences_given():
    async def main():
        pool = pool_of(Dns(*(f"10.0.0.{i}:50052" for i in range(1, 4))))
        drv = Driver(pool)
        for sid, p in prompts(9).items():
            drv.add(sid, p)
        await drv.step()
        counts = sorted(list(map(pool.placement, drv.tokens)).count(a) for a in pool.members)
        assert counts == [3, 3, 3]
        for sid in list(drv.tokens):
            drv.finish(sid)
        # One sequence at a time (each ends before the next starts): still every member in turn.
        used = []
        for i in range(6):
            drv.add(f"one-{i}", prompts(1)["seq-0"])
            await drv.step()
            used.append(pool.placement(f"one-{i}"))
            drv.finish(f"one-{i}")
        assert sorted(used.count(a) for a in pool.members) == [2, 2, 2]
        await pool.close()

    asyncio.run(main())


def test_a_member_that_raises_costs_only_its_own_drafts():
    async def main():
        members: dict[str, Member] = {}
        pool = pool_of(Dns("10.0.0.1:50052", "10.0.0.2:50052"), members)
        drv = Driver(pool)
        for sid, p in prompts(4).items():
            drv.add(sid, p)
        await drv.step()
        broken = members["10.0.0.1:50052"]

        async def boom(steps, timeout_s):
            raise RuntimeError("bug")

        broken.propose = boom
        got = await drv.step()
        assert set(got) == {s for s in drv.tokens if pool.placement(s) == "10.0.0.2:50052"}
        assert pool.member_stats["10.0.0.1:50052"].missed == 1
        await pool.close()

    asyncio.run(main())


def test_sequences_never_heard_of_again_are_forgotten():
    async def main():
        members: dict[str, Member] = {}
        pool = pool_of(Dns("10.0.0.1:50052"), members, idle_timeout_s=0.0)
        drv = Driver(pool)
        drv.add("seq-0", prompts(1)["seq-0"])
        await drv.step()
        await asyncio.sleep(0.01)
        assert pool.forget_idle() == ["seq-0"]
        assert pool.placement("seq-0") is None
        assert members["10.0.0.1:50052"]._released == ["seq-0"]
        await pool.close()

    asyncio.run(main())
