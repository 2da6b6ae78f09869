"""The gateway's prefix index (gateway/prefix_index.py), as a pure module: block keys of text,
token-id and chat prompts, the longest match, salts kept apart, LRU eviction under the cap, and
the choice of a replica from matches and loads."""

from __future__ import annotations

import planted_bugs as bug
import pytest

from gateway.prefix_index import (
    CHARS_PER_BLOCK,
    FALLBACK,
    IDS_PER_BLOCK,
    LEAST_LOAD,
    LOAD_IMBALANCE,
    PREFIX_HIT,
    Candidate,
    PrefixIndex,
    PrefixRoutingConfig,
    request_key,
    route,
)
from protos import common_pb2

B = CHARS_PER_BLOCK
SYSTEM = "You are a careful assistant who answers questions about Python. " * 3


def text(prompt: str, salt: str | None = None) -> common_pb2.GenerateRequest:
    req = common_pb2.GenerateRequest(text=prompt)
    if salt is not None:
        req.cache_salt = salt
    return req


def chat(*turns: tuple[str, str]) -> common_pb2.GenerateRequest:
    return common_pb2.GenerateRequest(options=common_pb2.GenerateOptions(
        messages=[common_pb2.ChatMessage(role=r, content=c) for r, c in turns]))


def test_the_longest_match_counts_whole_blocks_from_the_first():
    index = PrefixIndex(1000)
    base = "a" * B + "b" * B + "c" * B
    index.insert(request_key(text(base)))
    assert index.match(request_key(text(base))) == 3
    assert index.match(request_key(text(base + "tail"))) == 3  # a partial last block: no key
    assert index.match(request_key(text("a" * B + "b" * B + "x" * B))) == 2
    assert index.match(request_key(text("x" * B + "b" * B + "c" * B))) == 0  # keys are chained
    assert index.match(request_key(text("a" * (B - 1)))) == 0  # shorter than a block: no keys
    key = request_key(text(base + "d" * B))
    assert key.share(index.match(key)) == pytest.approx(3 / 4)
    ids = common_pb2.GenerateRequest(token_ids=common_pb2.TokenIds(ids=range(3 * IDS_PER_BLOCK)))
    index.insert(request_key(ids))
    longer = common_pb2.GenerateRequest(token_ids=common_pb2.TokenIds(
        ids=[*range(2 * IDS_PER_BLOCK), *[7] * IDS_PER_BLOCK]))
    assert index.match(request_key(longer)) == 2


def test_a_conversations_next_turn_matches_its_previous_turn():
    index = PrefixIndex(1000)
    turn1 = chat(("system", SYSTEM), ("user", "What does zip do?"))
    index.insert(request_key(turn1))
    turn2 = chat(("system", SYSTEM), ("user", "What does zip do?"),
                 ("assistant", "It pairs items of iterables. " * 4), ("user", "And map?"))
    key2 = request_key(turn2)
    assert index.match(key2) == len(request_key(turn1).keys) >= 2
    # with the answer recorded too (the pool records prompt + output once a stream ends), the
    # next turn matches all but its last block or so
    index.insert(request_key(turn1, output_text="It pairs items of iterables. " * 4))
    assert key2.share(index.match(key2)) > 0.8
    # the same words under another role, or a message cut elsewhere, is another prefix
    other = chat(("user", SYSTEM), ("user", "What does zip do?"))
    assert index.match(request_key(other)) == 0


def check_salts_are_kept_apart():
    index = PrefixIndex(1000)
    prompt = SYSTEM + "Question one?"
    index.insert(request_key(text(prompt, "tenant-a")))
    assert index.match(request_key(text(prompt, "tenant-a"))) == len(prompt) // B
    assert index.match(request_key(text(prompt, "tenant-b"))) == 0
    assert index.match(request_key(text(prompt))) == 0  # no salt is a salt of its own
    assert index.match(request_key(text(prompt, ""))) == 0


def test_salts_are_kept_apart():
    check_salts_are_kept_apart()


def test_the_check_catches_an_index_that_ignores_the_salt(monkeypatch):
    bug.prefix_index_ignores_the_salt(monkeypatch)
    with pytest.raises(AssertionError):
        check_salts_are_kept_apart()


def check_lru_eviction_under_the_cap():
    index = PrefixIndex(6)
    a = request_key(text("a" * 4 * B))
    b = request_key(text("b" * 4 * B))
    index.insert(a)
    index.insert(b)
    assert len(index) == 6
    # the least recent go first, and of one chain its tail before its head
    assert (index.match(a), index.match(b)) == (2, 4)
    index.insert(a)  # a is the most recent again: b loses its tail
    assert (index.match(a), index.match(b)) == (4, 2)
    index.insert(request_key(text("c" * 6 * B)))
    assert (index.match(a), index.match(b), len(index)) == (0, 0, 6)


def test_lru_eviction_under_the_cap():
    check_lru_eviction_under_the_cap()


def test_the_check_catches_an_index_that_evicts_the_newest(monkeypatch):
    bug.prefix_index_evicts_the_newest(monkeypatch)
    with pytest.raises(AssertionError):
        check_lru_eviction_under_the_cap()


def test_route_prefers_the_longest_match_within_the_load_bound():
    cfg = PrefixRoutingConfig(threshold=0.5, max_imbalance=2)
    key = request_key(text("a" * 10 * B))  # 10 blocks
    # candidate 0 is what least-requests routing would pick
    assert route(key, [Candidate(0, 0), Candidate(8, 1)], 0, cfg) == (1, PREFIX_HIT)
    assert route(key, [Candidate(3, 0), Candidate(4, 1)], 0, cfg) == (0, LEAST_LOAD)  # < half
    assert route(key, [Candidate(0, 0), Candidate(8, 2)], 0, cfg) == (1, PREFIX_HIT)
    assert route(key, [Candidate(0, 0), Candidate(8, 3)], 0, cfg) == (0, LOAD_IMBALANCE)
    # the replica holding it is draining, dead or failed the request
    assert route(key, [Candidate(0, 0), Candidate(8, 0, usable=False)], 0, cfg) == \
        (0, FALLBACK)
    assert route(key, [Candidate(6, 1), Candidate(8, 0, usable=False)], 0, cfg) == \
        (0, PREFIX_HIT)
    off = PrefixRoutingConfig(enabled=False)
    assert route(key, [Candidate(0, 0), Candidate(10, 0)], 0, off) == (0, LEAST_LOAD)
    with pytest.raises(ValueError):
        PrefixRoutingConfig(threshold=1.5)


def test_the_flags_reach_the_gateways_pool(target_model_dir):
    import argparse

    from gateway.config import GatewayConfig
    from splitspec.config import parse_config
    from splitspec.launcher import Stack
    from splitspec.launcher.up import add_command, stack_config

    config = parse_config(GatewayConfig, ["--no-prefix-routing", "--prefix-routing-threshold",
                                          "0.5", "--prefix-routing-max-blocks", "64"])
    assert config.prefix_routing_config() == PrefixRoutingConfig(False, 0.5, 8, 64)
    assert parse_config(GatewayConfig, []).prefix_routing_config() == PrefixRoutingConfig()

    def gateway_argv(*flags: str) -> list[str]:
        parser = argparse.ArgumentParser()
        add_command(parser.add_subparsers())
        args = parser.parse_args(["up", "--model", target_model_dir, *flags])
        (gateway,) = [s for s in Stack(stack_config(args)).services if s.name == "gateway"]
        return gateway.argv

    assert "--no-prefix-routing" in gateway_argv("--no-prefix-routing")
    assert "--no-prefix-routing" not in gateway_argv()
