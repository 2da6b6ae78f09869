"""The draft model's KV cache state: per sequence, the tokens whose KV the draft holds and that KV;
per draft call, the preallocated buffers of the lean forward; and the batch cache built from and
cut back into per-sequence caches.

Cache tensors are never written where a state's copy could see them: rollback keeps a view of a
prefix, and a draft call either builds new tensors or, for the one state that owns a `store`
(capacity buffers under its views, never handed to a copy), writes its new columns in place past
the state's length: batch-1 drafting then copies nothing per step. A state that owns a slot of
the resident cache (slots.py) views the slot's first columns and is written the same way, past
its length, in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, H_kv, L, D]


@dataclass
class Buffers:
    """Preallocated per-layer caches of one draft call (lean forward), the first `length`
    columns filled; owned by the call, so written in place."""

    kv: KV
    length: int

    def view(self) -> KV:
        return [(k[:, :, :self.length], v[:, :, :self.length]) for k, v in self.kv]


@dataclass
class SeqState:
    """One sequence's draft cache."""

    kv: KV | None = None  # None: nothing cached
    cached: list[int] = field(default_factory=list)  # tokens whose KV is in kv, in order
    # per token of the last draft: the draft model's two most likely tokens there and their
    # probabilities (its guesses of the recovered token, should the verifier reject that token)
    alternatives: list[tuple[list[int], list[float]]] = field(default_factory=list)
    # capacity buffers [1, H_kv, capacity, D] per layer whose first columns `kv` views; owned by
    # this state alone (a copy gets none), so new columns may be written into them in place
    store: KV | None = None
    # the resident cache's slot this state owns (slots.py; kv then views its first columns), or
    # None: kv is the state's own tensors
    slot: int | None = None

    def copy(self) -> "SeqState":
        """Another state over the same KV tensors, without the store or the slot (it never
        writes them; a slot's views stay valid until its owner writes again)."""
        return SeqState(None if self.kv is None else list(self.kv), list(self.cached))

    def length(self) -> int:
        return len(self.cached)

    def truncate(self, n: int) -> None:
        """Keep the first n cached positions (rollback of rejected drafts)."""
        if n >= len(self.cached):
            return
        self.cached = self.cached[:n]
        if self.kv is not None:
            self.kv = [(k[:, :, :n], v[:, :, :n]) for k, v in self.kv] if n else None


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def padded_cache(kvs: list[KV | None], lens: list[int], lmax: int) -> KV | None:
    """One batch cache: each row's KV right-aligned at lmax, zeros (masked) before it."""
    if lmax == 0:
        return None
    ref = next(kv for kv in kvs if kv is not None)
    layers = []
    for layer, (k0, v0) in enumerate(ref):
        keys = k0.new_zeros(len(kvs), k0.shape[1], lmax, k0.shape[3])  # [B, H_kv, Lmax, D]
        values = v0.new_zeros(len(kvs), v0.shape[1], lmax, v0.shape[3])
        for i, (kv, n) in enumerate(zip(kvs, lens)):
            if kv is not None and n:
                keys[i, :, lmax - n:] = kv[layer][0][0]
                values[i, :, lmax - n:] = kv[layer][1][0]
        layers.append((keys, values))
    return layers


def row_kv(kv: KV, row: int, spans: list[tuple[int, int]]) -> KV:
    """Row `row` of a batch cache ([B, H_kv, L, D] per layer) as a sequence's cache
    ([1, H_kv, sum of span lengths, D]): the columns [a, z) of each span, in order."""
    return [(torch.cat([k[row:row + 1, :, a:z] for a, z in spans], dim=2),
             torch.cat([v[row:row + 1, :, a:z] for a, z in spans], dim=2))
            for k, v in kv]
