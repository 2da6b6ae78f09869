"""Prefix-aware routing: an approximate, bounded index per verifier replica of the prompt prefixes
it was recently sent, and the choice of a replica from it. Pure; no I/O.

A request's prefix is cut into fixed blocks of its prompt as the gateway sees it (characters of
a text prompt, token ids, or a chat's messages serialized canonically: role and length-prefixed
content per message, so one conversation's next turn extends its previous turn's prefix), and
each full block gets a key chained from its parent's: BLAKE2b of the parent key and the block.
The chain's root digests the prompt's kind and the request's cache salt, so requests with
different salts never share a key, whatever their text. A key names its whole prefix, so
"replica R holds the first m blocks" is m leading keys found in R's index.

Each replica's index is an LRU set of keys capped at `max_blocks` (16-byte keys, about 140
bytes each with the set's own: some 9 MiB at the default). A chain is inserted from its last
block to its first, so the first blocks are the most recent and eviction takes a chain's tail
before its head, as a verifier's own cache does. The index is approximate by design: it
records what was routed, not what the replica's cache still holds (the verifier may have
evicted it), as SGLang's cache-aware router's radix tree does.

The choice (route): the replica whose index matches the longest prefix, when that covers at
least `threshold` of the prompt and the replica has at most `max_imbalance` more requests in
flight than the least loaded one; else the least loaded one, as without prefix routing."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from protos import common_pb2

CHARS_PER_BLOCK = 64  # text and chat prompts: characters per block (a 16-token KV block or so)
IDS_PER_BLOCK = 16  # token-id prompts: ids per block
_DIGEST = 16  # bytes per key

# Why a request went where it went (splitspec_gateway_routing_decisions_total{reason}).
PREFIX_HIT = "prefix_hit"  # to the replica holding its longest prefix
LEAST_LOAD = "least_load"  # no prefix match above the threshold (or routing by prefix off)
LOAD_IMBALANCE = "load_imbalance"  # a match, but its replica was too busy beside the others
FALLBACK = "fallback"  # its replica is gone, draining or failed it: another one took it
REASONS = (PREFIX_HIT, LEAST_LOAD, LOAD_IMBALANCE, FALLBACK)


@dataclass(frozen=True)
class PrefixRoutingConfig:
    enabled: bool = True
    threshold: float = 0.3  # least share of the prompt matched to route by prefix
    max_imbalance: int = 8  # most extra requests in flight on the matched replica
    max_blocks: int = 65_536  # keys per replica's index (about 9 MiB)

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"prefix routing threshold {self.threshold} is not in [0, 1]")
        if self.max_blocks < 1 or self.max_imbalance < 0:
            raise ValueError("prefix routing needs max_blocks >= 1 and max_imbalance >= 0")


@dataclass(frozen=True)
class PrefixKey:
    """A request's chain of block keys, the length of its prompt and the size of a block, both
    in the units its blocks are cut in (characters or token ids)."""

    keys: tuple[bytes, ...]
    units: int
    block: int

    def share(self, blocks: int) -> float:
        """The share of the prompt that its first `blocks` blocks cover."""
        return min(blocks * self.block, self.units) / self.units if self.units else 0.0


def _root(kind: bytes, salt: str | None) -> bytes:
    salted = b"\x00" if salt is None else b"\x01" + salt.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(b"splitspec-route\x00" + kind + b"\x00" + salted,
                           digest_size=_DIGEST).digest()


def chain(root: bytes, blocks: Sequence[bytes]) -> list[bytes]:
    """The key of each block: the digest of its parent's key (the root for the first) and its
    own bytes."""
    keys, parent = [], root
    for block in blocks:
        parent = hashlib.blake2b(parent + block, digest_size=_DIGEST).digest()
        keys.append(parent)
    return keys


def _chat_units(messages) -> str:
    """A chat's messages as one string in which each message delimits itself, so a
    conversation's later turn starts with its earlier turn's string."""
    return "".join(f"{m.role}\x1f{len(m.content)}\x1f{m.content}" for m in messages)


def request_key(req: common_pb2.GenerateRequest, output_ids: Sequence[int] = (),
                output_text: str = "") -> PrefixKey:
    """The prefix key of a request's prompt, followed by its output when one is given (what the
    replica's cache holds once it has answered: a conversation's next turn starts with it)."""
    salt = req.cache_salt if req.HasField("cache_salt") else None
    if req.WhichOneof("prompt") == "token_ids":
        ids = array("i", req.token_ids.ids)
        ids.extend(output_ids)
        data, step = ids.tobytes(), IDS_PER_BLOCK * ids.itemsize
        blocks = [data[i * step:(i + 1) * step] for i in range(len(ids) // IDS_PER_BLOCK)]
        return PrefixKey(tuple(chain(_root(b"ids", salt), blocks)), len(req.token_ids.ids),
                         IDS_PER_BLOCK)
    if req.options.messages:
        messages = list(req.options.messages)
        if output_text:
            messages.append(common_pb2.ChatMessage(role="assistant", content=output_text))
        text, kind, units = (_chat_units(messages), b"chat",
                             len(_chat_units(req.options.messages)))
    else:
        text, kind, units = req.text + output_text, b"text", len(req.text)
    blocks = [text[i:i + CHARS_PER_BLOCK].encode("utf-8", "surrogatepass")
              for i in range(0, len(text) - CHARS_PER_BLOCK + 1, CHARS_PER_BLOCK)]
    return PrefixKey(tuple(chain(_root(kind, salt), blocks)), units, CHARS_PER_BLOCK)


class PrefixIndex:
    """One replica's recently routed prefixes: an LRU set of block keys, at most max_blocks."""

    def __init__(self, max_blocks: int):
        self.max_blocks = max_blocks
        self._keys: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, key: PrefixKey) -> int:
        """How many of the key's blocks, from the first, this replica was sent."""
        n = 0
        for k in key.keys:
            if k not in self._keys:
                break
            n += 1
        return n

    def insert(self, key: PrefixKey) -> None:
        """Record the key's blocks as the most recent; evict the least recent past the cap."""
        for k in reversed(key.keys):
            self._keys[k] = None
            self._keys.move_to_end(k)
        while len(self._keys) > self.max_blocks:
            self._keys.popitem(last=False)

    def clear(self) -> None:
        self._keys.clear()


@dataclass(frozen=True)
class Candidate:
    """A replica as the choice sees it: its matched blocks, its load, and whether it can take
    the request (serving, and it has not failed this request)."""

    matched: int
    in_flight: int
    usable: bool = True


def route(key: PrefixKey, candidates: Sequence[Candidate], least: int,
          config: PrefixRoutingConfig) -> tuple[int, str]:
    """The candidate to send the request to, and why. `least`: the one routing without prefixes
    would pick (usable, least requests in flight)."""
    if not config.enabled or not candidates:
        return least, LEAST_LOAD
    best = max(range(len(candidates)),
               key=lambda i: (candidates[i].matched, candidates[i].usable,
                              -candidates[i].in_flight))
    if not candidates[best].matched or key.share(candidates[best].matched) < config.threshold:
        return least, LEAST_LOAD
    if not candidates[best].usable:
        # the replica holding this prefix is down, draining or failed the request: the best
        # usable match, if one is above the threshold, else the least loaded
        usable = [i for i, c in enumerate(candidates) if c.usable and c.matched and
                  key.share(c.matched) >= config.threshold]
        if not usable:
            return least, FALLBACK
        best = max(usable, key=lambda i: (candidates[i].matched, -candidates[i].in_flight))
    if candidates[best].in_flight - candidates[least].in_flight > config.max_imbalance:
        return least, LOAD_IMBALANCE
    return best, PREFIX_HIT
