"""Prefix-cache keys: what names the contents of a full KV block, so that a block computed for
one request can serve another whose prompt starts the same way.

A full block's key is a BLAKE2b digest of its parent's key (the block before it; the root key
for the first) and its token ids. The root key digests the extra keys every block of a request
shares: the model and the request's cache salt. Chaining makes a key name the whole prefix up
to the block's end, not just its own tokens: equal blocks after different prefixes hold
different keys and values, and must never be shared. A salt in the root keeps tenants apart:
requests with different salts share no key.

    root      blake2b(b"splitspec-kv" | model | 0x00 | salt)           (32 bytes)
    block i   blake2b(key(i - 1) | token ids of block i as int32 LE)   (32 bytes)

(Python's hash() is never used: it is salted per process, and 64 bits invite collisions that
would hand one request another's keys and values.)
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

DIGEST = 32


def root_key(model: str, salt: str | None) -> bytes:
    """The parent of a request's first block: the model and the cache salt (None and "" alike:
    no salt)."""
    h = hashlib.blake2b(b"splitspec-kv", digest_size=DIGEST)
    h.update(model.encode())
    h.update(b"\x00")
    h.update((salt or "").encode())
    return h.digest()


def block_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a full block holding `tokens`, after the block whose key is `parent`."""
    h = hashlib.blake2b(parent, digest_size=DIGEST)
    h.update(np.asarray(tokens, dtype="<i4").tobytes())
    return h.digest()


def extend_keys(keys: list[bytes], root: bytes, tokens: Sequence[int], block_size: int,
                num_tokens: int) -> list[bytes]:
    """Extend `keys` (the keys of a sequence's first len(keys) blocks) in place to cover every
    full block within tokens[:num_tokens]; returns it."""
    for i in range(len(keys), num_tokens // block_size):
        parent = keys[i - 1] if i else root
        keys.append(block_key(parent, tokens[i * block_size:(i + 1) * block_size]))
    return keys
