"""The step plan: one engine step turned into flat index arrays on the host, without touching the
device.

The scheduler decides which sequences run and how many rows each feeds; the collector brings
their drafts. The plan turns that into everything the device needs for the step, in ONE host
buffer (int64, pinned on accelerators) that the step executor copies in with one non-blocking
copy (verifier_service/step/executor.py):

    ids, positions, slots [T]      the fed rows: token, position (a tree node: its depth), and
                                   the cache slot its K/V goes to (padding rows: the trash block)
    block_tables [B, NB]           each sequence's blocks (padding: the trash block); attention
    start, context_lens [B]        reads its context through them on the device
    query_index [B, R], packed_index [T]
                                   packed row <-> (sequence, fed row), for batched attention
    first_node [B], node_bits [T]  trees: a sequence's fed rows from first_node on are draft
                                   nodes; a node row sees the node rows whose bits are set
                                   (ancestors and itself) and every row before first_node
    logits_rows [L]                the rows whose logits are computed
    target_idx, draft_ids, draft_valid [S, K], bonus_base [S]
                                   greedy chain verification on the device: draft j of sampler
                                   row s is accepted iff argmax(logits[target_idx[s, j]]) equals
                                   it; the extra token is the argmax of row bonus_base + accepted
    real_rows [T_out]              (buckets) the logits rows of the ragged layout the eager
                                   samplers read (kernels/layout.py)

Two shapes. On a device that replays captured graphs, a step whose every sequence is decoding
(one uncached token plus its draft) runs in a *bucket*: B_b sequences x R rows each, the
smallest of the ladder that holds it; padding rows and padding sequences write to the trash
block and read only it. Every other step (prefill chunks, a bucket too small) runs at its exact
shape, as every step does on the CPU, where a padding row costs real compute (the CPU's ladder
is empty). A bucket's arrays sit at offsets fixed by the bucket alone, so a graph captured for
it reads them at the same addresses every time.

The plan also carries the step's StepLayout (kernels/layout.py), the host-side picture the
samplers and the results read, built once as before.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from kernels.layout import StepLayout
from splitspec.graphs import powers_up_to

__all__ = ["Bucket", "BucketLadder", "PlanFields", "StepPlan", "plan_step", "MAX_BUCKET_NODES"]

# node_bits is one int64 word per row: a bucket holds trees of at most this many nodes
MAX_BUCKET_NODES = 64


@dataclass(frozen=True, order=True)
class Bucket:
    """A padded step shape: num_seqs sequences x rows fed rows each (1 + draft nodes)."""

    num_seqs: int
    rows: int

    @property
    def num_tokens(self) -> int:
        return self.num_seqs * self.rows

    def __str__(self) -> str:
        return f"{self.num_seqs}x{self.rows}"


class BucketLadder:
    """The bucket shapes a device runs decode steps at. Empty (the CPU's): every step exact."""

    def __init__(self, seqs: Sequence[int] = (), rows: Sequence[int] = ()):
        if bool(seqs) != bool(rows):
            raise ValueError("a ladder needs both sequence counts and row counts, or neither")
        if any(n < 1 for n in (*seqs, *rows)):
            raise ValueError("bucket sizes must be >= 1")
        if rows and max(rows) > MAX_BUCKET_NODES + 1:
            raise ValueError(f"a bucket holds at most {MAX_BUCKET_NODES + 1} rows per sequence")
        self.seqs = tuple(sorted(set(seqs)))
        self.rows = tuple(sorted(set(rows)))

    @classmethod
    def powers_of_two(cls, max_num_seqs: int, max_rows: int) -> "BucketLadder":
        """1, 2, 4, ... and the maxima themselves: always max_num_seqs x max_rows, so every
        decode step the scheduler can form has a bucket."""
        max_rows = min(max_rows, MAX_BUCKET_NODES + 1)
        return cls(list(powers_up_to(max_num_seqs)), list(powers_up_to(max_rows)))

    @property
    def exact(self) -> bool:
        return not self.seqs

    def __iter__(self):
        """Every bucket, largest first (graphs are captured in this order, so the smaller ones
        reuse the largest one's memory)."""
        return iter(sorted((Bucket(b, r) for b in self.seqs for r in self.rows), reverse=True))

    def __len__(self) -> int:
        return len(self.seqs) * len(self.rows)

    def choose(self, num_seqs: int, rows: int) -> Bucket | None:
        """The smallest bucket holding num_seqs sequences of up to `rows` rows; None when none
        does (or the ladder is empty): the step runs at its exact shape."""
        b = next((n for n in self.seqs if n >= num_seqs), None)
        r = next((n for n in self.rows if n >= rows), None)
        return None if b is None or r is None else Bucket(b, r)

    def __repr__(self) -> str:
        return f"BucketLadder(seqs={self.seqs}, rows={self.rows})"


# The plan's arrays, in buffer order: name -> shape as a function of the plan's sizes
#   T fed rows, B sequences, NB blocks per table, R rows per sequence (max query length),
#   L logits rows, S sampler rows, K draft columns, O ragged logits rows (buckets; 0 exact)
_FIELDS = (
    ("ids", ("T",)), ("positions", ("T",)), ("slots", ("T",)),
    ("block_tables", ("B", "NB")), ("start", ("B",)), ("context_lens", ("B",)),
    ("query_index", ("B", "R")), ("packed_index", ("T",)),
    ("first_node", ("B",)), ("node_bits", ("T",)),
    ("logits_rows", ("L",)),
    ("target_idx", ("S", "K")), ("draft_ids", ("S", "K")), ("draft_valid", ("S", "K")),
    ("bonus_base", ("S",)), ("real_rows", ("O",)),
)


@dataclass(frozen=True)
class PlanFields:
    """Where each array sits in the flat buffer, for one set of sizes (a bucket's are fixed)."""

    sizes: tuple[tuple[str, int], ...]
    # name -> (offset, length, shape), in buffer order
    places: tuple[tuple[str, int, int, tuple[int, ...]], ...] = field(compare=False, hash=False,
                                                                    default=())
    total: int = 0

    @classmethod
    def of(cls, **sizes: int) -> "PlanFields":
        return _fields(tuple(sorted(sizes.items())))

    @classmethod
    def for_bucket(cls, bucket: Bucket, max_blocks: int) -> "PlanFields":
        b, r = bucket.num_seqs, bucket.rows
        return cls.of(T=b * r, B=b, NB=max_blocks, R=r, L=b * r, S=b, K=r - 1, O=b * r)

    def size(self, name: str) -> int:
        return dict(self.sizes)[name]

    @property
    def offsets(self) -> dict[str, int]:
        return {name: at for name, at, _, _ in self.places}

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each array as a view of `flat` (host or device)."""
        parts = flat[:self.total].split([n for _, _, n, _ in self.places])
        return {name: part.view(shape) for (name, _, _, shape), part in zip(self.places, parts)}

    def arrays(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Each array as a view of the host buffer `flat` (numpy)."""
        return {name: flat[at:at + n].reshape(shape) for name, at, n, shape in self.places}


@functools.lru_cache(maxsize=512)
def _fields(sizes: tuple[tuple[str, int], ...]) -> PlanFields:
    dims, places, at = dict(sizes), [], 0
    for name, names in _FIELDS:
        shape = tuple(dims[d] for d in names)
        n = math.prod(shape)
        places.append((name, at, n, shape))
        at += n
    return PlanFields(sizes, tuple(places), at)


@dataclass
class StepPlan:
    """One step, ready for the executor. `host` holds every array (PlanFields order)."""

    layout: StepLayout  # the ragged step, host-side: what the samplers and results read
    bucket: Bucket | None  # None: the step runs at its exact shape
    block_size: int
    fields: PlanFields
    host: torch.Tensor  # int64 [fields.total]
    chain: bool  # every draft a chain (the in-graph greedy verification applies)
    # columns attention gathers per sequence: a bucket's whole table width (fixed per bucket),
    # an exact step's longest context
    max_context: int = 0
    # one sequence whose context is one run of slots [first, end): attention reads a view
    context_range: tuple[int, int] | None = None
    # the layout's ancestor relation (exact steps with trees), for the reference attention
    # (built on the device where a tree is still there: device_drafts.py)
    ancestors: torch.Tensor | None = None
    arrays: dict = field(default_factory=dict, repr=False)  # numpy views of `host`
    # (offset into the flat buffer, or int64 host indices into it; int64 device tensor): copied
    # over `host`'s values on the device before the step runs (drafts still on the device:
    # their ids, a tree's positions and node bits; verifier_service/step/device_drafts.py)
    device_ids: list = field(default_factory=list, repr=False)

    def draft_offsets(self, seq: int, row: int, k: int) -> tuple[int, int]:
        """Where sequence `seq`'s k draft tokens sit in the flat buffer (it is sampler row
        `row`): its fed rows' ids, and its row of the verification's draft ids."""
        layout, at = self.layout, self.fields.offsets
        fed = int(layout.query_lens[seq]) - k  # its rows before the drafts
        first = (int(layout.query_start[seq]) if self.bucket is None
                 else seq * self.fields.size("R")) + fed
        return at["ids"] + first, at["draft_ids"] + row * self.fields.size("K")

    @property
    def num_tokens(self) -> int:
        return self.fields.size("T")

    @property
    def max_query_len(self) -> int:
        return self.fields.size("R")


def plan_step(layout: StepLayout, input_ids: Sequence[int], tables: Sequence[Sequence[int]],
              block_size: int, trash_block: int, ladder: BucketLadder | None = None,
              max_blocks: int = 0, out: torch.Tensor | None = None,
              bucket: Bucket | None = None) -> StepPlan:
    """Plan the step `layout` describes: input_ids [T_in] packed as it says (each sequence's
    uncached tokens, then its draft nodes), tables the sequences' block ids (room reserved for
    every fed row). `max_blocks`: a bucket's block-table width (fixed per bucket: the longest
    context the verifier serves). `out`: a host buffer to write into (the executor's pinned
    staging buffer); a fresh tensor when None or too short. `bucket` forces the shape (a step
    of padding only, to capture a bucket's graph: an empty layout)."""
    q_arr = layout.query_lens.numpy()
    start_arr = layout.start_pos.numpy()
    b_real = len(q_arr)
    emitting = layout.seq_index.numpy()
    k_s = layout.num_draft_tokens.numpy()  # per emitting sequence
    every_emits = len(emitting) == b_real
    k_all = k_s if every_emits else np.zeros(b_real, dtype=np.int64)
    if not every_emits:
        k_all[emitting] = k_s
    any_tree = layout.ancestors is not None
    n_real = int(q_arr.sum())
    max_q = int(q_arr.max()) if b_real else 0
    if bucket is None and ladder is not None and b_real and every_emits \
            and n_real - int(k_all.sum()) == b_real \
            and not (any_tree and int(k_all.max()) > MAX_BUCKET_NODES):
        bucket = ladder.choose(b_real, max_q)  # every sequence decoding: 1 row + its draft
    nb_real = max((len(t) for t in tables), default=1) or 1
    if bucket is not None:
        fields = PlanFields.for_bucket(bucket, max(max_blocks, nb_real))
    else:
        fields = PlanFields.of(T=n_real, B=b_real, NB=nb_real, R=max_q,
                               L=int(layout.logits_indices.numel()), S=len(emitting),
                               K=layout.max_k, O=0)
    host = (out[:fields.total] if out is not None and out.numel() >= fields.total
            else torch.empty(fields.total, dtype=torch.int64))
    a = fields.arrays(host.numpy())
    sizes = dict(fields.sizes)
    n_rows, big_r, kk = sizes["T"], sizes["R"], sizes["K"]
    query_start = layout.query_start.numpy()
    ctx = start_arr + q_arr

    # -- per sequence: block tables (padding: the trash block), lengths, the draft's region
    bt = a["block_tables"]
    bt.fill(trash_block)
    for i, t in enumerate(tables):
        bt[i, :len(t)] = t
    a["start"].fill(0)
    a["start"][:b_real] = start_arr
    a["context_lens"].fill(0)
    a["context_lens"][:b_real] = ctx
    first = q_arr - k_all if any_tree else q_arr
    a["first_node"].fill(big_r)
    a["first_node"][:b_real] = first

    # -- per fed row: token, position, slot, node bits; packed at query_start (exact) or at
    # b * R (a bucket, whose padding rows feed token 0 at position 0 into the trash block)
    seq_of = np.repeat(np.arange(b_real), q_arr)
    exact_row = np.arange(n_real)
    local = exact_row - query_start[seq_of]
    ids, pos, slots, bits = a["ids"], a["positions"], a["slots"], a["node_bits"]
    if bucket is None:
        rows = exact_row
    else:
        rows = seq_of * big_r + local
        ids.fill(0)
        pos.fill(0)
        slots[:] = trash_block * block_size + np.arange(n_rows) % block_size
    ids[rows] = input_ids
    pos[rows] = layout.query_positions.numpy()
    cols = start_arr[seq_of] + local  # the cache column of each fed row
    slots[rows] = bt[seq_of, cols // block_size] * block_size + cols % block_size
    bits.fill(0)
    if any_tree:
        bits[rows] = _node_bits(layout.parents.numpy(), local, first[seq_of])

    # -- attention's maps between packed rows and [B, R] query slots
    qi, pi = a["query_index"], a["packed_index"]
    if bucket is None:
        qi.fill(n_rows)
        qi[seq_of, local] = exact_row
        pi[:] = seq_of * big_r + local
    else:
        qi.reshape(-1)[:] = np.arange(n_rows)
        pi[:] = np.arange(n_rows)

    # -- logits rows, and greedy chain verification: sampler row s's draft j sits in fed row
    # first_s + j, its target in logits row base_s + j (base_s: the row that picks d1)
    if bucket is None:
        a["logits_rows"][:] = layout.logits_indices.numpy()
        base = layout.target_offsets.numpy()
        draft_rows = query_start[emitting] + q_arr[emitting] - k_s
    else:
        a["logits_rows"][:] = np.arange(n_rows)
        base = emitting * big_r + (q_arr[emitting] - k_s - 1)
        draft_rows = base + 1
        real = a["real_rows"]
        real.fill(0)
        if len(base):
            n_out = int(k_s.sum()) + len(base)
            real[:n_out] = np.repeat(base, k_s + 1) + (
                np.arange(n_out) - np.repeat(np.cumsum(k_s + 1) - (k_s + 1), k_s + 1))
    bonus = a["bonus_base"]
    bonus.fill(0)
    bonus[:len(base)] = base
    a["target_idx"][:] = bonus[:, None]  # padding sequences point at their own row
    a["draft_ids"].fill(0)
    a["draft_valid"].fill(0)
    if kk and len(base):
        j = np.arange(kk)
        valid = j[None] < k_s[:, None]  # [S, K]
        a["target_idx"][:len(base)] = base[:, None] + np.minimum(j[None], k_s[:, None])
        a["draft_valid"][:len(base)] = valid
        dr = a["draft_ids"][:len(base)]
        dr[valid] = ids[(draft_rows[:, None] + j[None])[valid]]

    span = None
    if b_real == 1 and bucket is None and tables and tables[0]:
        t, n_ctx = tables[0], int(ctx[0])
        used = -(-n_ctx // block_size)
        if t[used - 1] - t[0] == used - 1 and all(t[i + 1] == t[i] + 1 for i in range(used - 1)):
            span = (t[0] * block_size, t[0] * block_size + n_ctx)
    max_context = (fields.size("NB") * block_size if bucket is not None
                   else int(ctx.max()) if b_real else 0)
    return StepPlan(layout, bucket, block_size, fields, host, chain=not any_tree,
                    max_context=max_context, context_range=span,
                    ancestors=layout.ancestors if bucket is None else None, arrays=a)


def _node_bits(parents: np.ndarray, local: np.ndarray, row_first: np.ndarray) -> np.ndarray:
    """int64 [T]: per fed row, bit m set for every draft node m among its ancestors and itself
    (0 for rows before the sequence's first node). parents: each row's parent's fed index."""
    node = local - row_first  # node index of each fed row (< 0: not a draft node)
    out = np.zeros(len(local), dtype=np.uint64)
    for t in np.flatnonzero(node >= 0):  # parents precede children: one pass in row order
        p = parents[t]
        above = out[t - local[t] + p] if p >= row_first[t] else np.uint64(0)
        out[t] = above | (np.uint64(1) << np.uint64(node[t]))
    return out.view(np.int64)
