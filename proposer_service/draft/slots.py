"""The draft model's device-resident KV cache: one preallocated cache per layer, a slot (a row
of `capacity` columns) per live sequence, so drafting writes each sequence's new columns in place
and a step copies no sequence's cache in or out.

    keys, values   per layer [slots + scratch, capacity, H_kv, D] (a slot's columns one after
                   the other: the layout kernels/paged_attention.py addresses, one block of
                   `capacity` columns per slot, which the captured loop uses, graphs.py)

A sequence's SeqState (cache.py) that holds a slot sees its first `length` columns as views
([1, H_kv, length, D]); rollback of rejected drafts is a length change (the views cut), and the
slot goes back to the free list when the sequence finishes. Columns past a slot's length are
scratch: a step's padding queries and drafts beyond the kept ones are written there and
overwritten later; they are never read unmasked.

Slots run out gracefully: a sequence that finds none (or outgrows `capacity`) keeps its cache as
its own tensors and drafts on the per-sequence path (proposer.py), exactly as before this cache
existed; it is never refused a draft for want of a slot.

`forward` is the eager forward over the slots (the CPU path, and an accelerator's where no graph
serves the step): ids [B, S] written at each row's own columns, each query attending to its
row's columns up to its own; the same masks as the per-sequence path, without a padded batch
cache.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from proposer_service.draft.cache import KV, SeqState, common_prefix
from splitspec.lean_llama import LeanDecoder


class DraftSlots:
    def __init__(self, lean: LeanDecoder, device: torch.device, slots: int, capacity: int,
                 scratch: int = 0):
        """slots: sequences resident at once; capacity: columns per slot; scratch: rows after
        the slots that no sequence owns (the captured loop's, graphs.py: rows it borrows for
        caches that live elsewhere, and the last one for its batch's padding rows). Allocated
        on first use (a proposer that never drafts costs nothing)."""
        self.lean, self.device = lean, device
        self.slots, self.capacity, self.scratch = slots, capacity, scratch
        self._kv: KV | None = None
        self._free = list(range(slots - 1, -1, -1))  # popped from the end: slot 0 first
        self._lock = threading.Lock()  # sessions of several verifier streams share the slots

    @staticmethod
    def slot_bytes(lean: LeanDecoder, capacity: int) -> int:
        """Memory of one slot (every layer's keys and values)."""
        return (2 * len(lean.layers) * capacity * lean.n_kv * lean.head_dim
                * lean.embed.element_size())

    @property
    def kv(self) -> KV:
        with self._lock:
            if self._kv is None:
                self._kv = self._allocate()
        return self._kv

    def _allocate(self) -> KV:
        shape = (self.slots + self.scratch, self.capacity, self.lean.n_kv, self.lean.head_dim)
        dtype = self.lean.embed.dtype
        # zeros: a masked column read must hold a finite number (0 x NaN is NaN); normal
        # tensors (written in inference mode and out of it, e.g. by a graph's warm-up)
        with torch.inference_mode(False):
            return [(torch.zeros(shape, dtype=dtype, device=self.device),
                     torch.zeros(shape, dtype=dtype, device=self.device))
                    for _ in self.lean.layers]

    def free_slots(self) -> int:
        return len(self._free)

    # -- ownership -----------------------------------------------------------------------------

    @torch.inference_mode()
    def bind(self, state: SeqState) -> bool:
        """Give a slotless state a slot: its cache copied in (device copies), its kv the slot's
        views from then on. False (state untouched) when no slot is free or it does not fit."""
        if state.slot is not None or self.slots <= 0 or state.length() >= self.capacity:
            return state.slot is not None
        with self._lock:
            if not self._free:
                return False
            slot = self._free.pop()
        n = state.length()
        if state.kv is not None and n:
            self.write(slot, state.kv, 0, n)
        state.slot, state.store = slot, None
        state.kv = self.view(slot, n)
        return True

    @torch.inference_mode()
    def unbind(self, state: SeqState | None, keep_cache: bool = False) -> None:
        """Free a state's slot; keep_cache: its cache copied out into its own tensors first
        (the state lives on without the slot: a sequence that outgrew it, or one kept for
        prefix reuse)."""
        if state is None or state.slot is None:
            return
        if keep_cache and state.kv is not None:
            state.kv = [(k.clone(), v.clone()) for k, v in state.kv]
        elif not keep_cache:
            state.kv, state.cached = None, []
        slot, state.slot = state.slot, None
        with self._lock:
            self._free.append(slot)

    # -- columns -------------------------------------------------------------------------------

    def view(self, slot: int, n: int) -> KV | None:
        """The slot's first n columns as a cache ([1, H_kv, n, D] per layer, views)."""
        if n == 0:
            return None
        return [(k[slot, :n].transpose(0, 1)[None], v[slot, :n].transpose(0, 1)[None])
                for k, v in self.kv]

    @torch.inference_mode()
    def write(self, slot: int, kv: KV, start: int, end: int) -> None:
        """Columns [start, end) of a cache ([1, H_kv, L, D] per layer) into the slot's same
        columns."""
        for (kb, vb), (k, v) in zip(self.kv, kv):
            kb[slot, start:end].copy_(k[0, :, start:end].transpose(0, 1))
            vb[slot, start:end].copy_(v[0, :, start:end].transpose(0, 1))

    @torch.inference_mode()
    def adopt(self, state: SeqState, owner: SeqState) -> None:
        """A slotless state (drafted ahead from `owner`'s cache) becomes the owner of owner's
        slot: only the columns where it differs from what the slot holds are copied in (one
        that outgrew the slot keeps its own tensors, and the slot is freed)."""
        slot, n = owner.slot, state.length()
        if n + 1 >= self.capacity:
            self.unbind(owner)
            return
        same = min(common_prefix(owner.cached, state.cached), owner.length())
        if state.kv is not None and n > same:
            self.write(slot, state.kv, same, n)
        owner.slot = None
        state.slot, state.store = slot, None
        state.kv = self.view(slot, n)

    def refresh(self, state: SeqState) -> None:
        """A slotted state's views after its length changed."""
        state.kv = self.view(state.slot, state.length())

    # -- the eager forward -----------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, pos: torch.Tensor, slots: list[int],
                slot_t: torch.Tensor, cols: torch.Tensor, span: int,
                last: torch.Tensor | None, col: int | None = None) -> torch.Tensor:
        """ids, pos [B, S]: row i's tokens, written at columns cols[i] .. cols[i] + S - 1 of
        slot slots[i] (slot_t: the same on the device; cols [B] on the device; col: cols[0] on
        the host when B is 1, written as a slice); span: the columns any query may read (at
        least max(cols) + S). Returns the logits [B, V] of each row's query `last[i]` (None:
        the last)."""
        lean = self.lean
        b, s = ids.shape
        at = cols[:, None] + torch.arange(s, device=ids.device)  # [B, S]: each query's column
        contiguous = slots == list(range(slots[0], slots[0] + b))
        mask = None
        if b > 1 or s > 1:
            mask = (torch.arange(span, device=ids.device) <= at[:, :, None])[:, None]
        groups = lean.n_heads // lean.n_kv
        first = slots[0]

        def attend(i, q, k, v):
            kb, vb = self.kv[i]
            if col is not None and b == 1:
                kb[first, col:col + s] = k[0].transpose(0, 1)  # [S, H_kv, D]
                vb[first, col:col + s] = v[0].transpose(0, 1)
            else:
                kb[slot_t[:, None], at] = k.transpose(1, 2).to(kb.dtype)  # [B, S, H_kv, D]
                vb[slot_t[:, None], at] = v.transpose(1, 2).to(vb.dtype)
            if contiguous:
                keys, values = kb[first:first + b, :span], vb[first:first + b, :span]
            else:
                keys, values = kb[slot_t, :span], vb[slot_t, :span]
            att = F.scaled_dot_product_attention(
                q, keys.transpose(1, 2).to(q.dtype), values.transpose(1, 2).to(q.dtype),
                attn_mask=mask, scale=lean.scale, enable_gqa=groups > 1)
            return att.transpose(1, 2).reshape(b, s, -1)

        hidden = lean.hidden(ids, pos, attend)  # [B, S, H]
        if last is None:
            row = hidden[:, -1]
        else:
            row = hidden.gather(1, last[:, None, None].expand(b, 1, hidden.shape[-1]))[:, 0]
        return lean.head(row)  # [B, V]
