"""Tensor parallelism: one model's weights and KV heads split over N ranks, one process per
device, Megatron-style, inside the lean decoder's own structure (splitspec/lean_llama.py).

What rank r of N holds and does in one forward:

    embedding   vocabulary-parallel: rows [r V', (r + 1) V') of the table (V' = ceil(V / N));
                a token outside them looks up zeros, and one all-reduce sums the ranks' rows
                (exactly one is not zero, so the sum is the row itself, bit for bit)
    q, k, v     column-parallel, still one fused product: its H_q / N query heads and
                H_kv / N key/value heads, attending over its own shard of the KV cache
    o_proj      row-parallel: the columns of its heads; one all-reduce
    gate, up    column-parallel, still fused: its I / N rows of each
    down_proj   row-parallel: the matching columns; one all-reduce
    head        vocabulary-parallel: logits [L, V'] for the L rows that get logits, then one
                all-gather: every rank has [L, V]
    norms       replicated (they are vectors)

So a forward costs 2 all-reduces per layer, one for the embedding and one all-gather for the
head, all on the device's collective backend (NCCL, CNCL, gloo: splitspec/device.py). After each
all-reduce every rank holds the same residual stream, so the final hidden states rank 0 hands to
hidden-state proposers are the whole ones. What the host sends (a step's plan) travels over a
second group that is always gloo (verifier_service/tp/broadcast.py). Sharding needs the lean
forward and a KV head count that N divides (`check_shardable`); the transformers forward is not
sharded.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from kernels.linear import PackedLinear, resolve
from splitspec import device as dev
from splitspec.errors import Unavailable

__all__ = ["RankLost", "TPGroup", "check_shardable", "init_group", "shard_decoder",
           "weight_bytes"]

log = logging.getLogger(__name__)

# The plan broadcast waits as long as the engine idles (no request for days is no failure);
# the forward's collectives wait at most this long for a rank before the group counts as broken.
COLLECTIVE_TIMEOUT_S = 600.0
HOST_TIMEOUT = timedelta(days=365)


class RankLost(Unavailable):
    """A rank of the group is gone (its process died, its connection broke): the step cannot
    finish on this verifier. UNAVAILABLE: a gateway resumes the request on another replica."""


@dataclass
class TPGroup:
    """This process's place in a tensor-parallel group, and the group's collectives. `counts`
    counts each collective called (the tests read how many a step costs)."""

    rank: int
    size: int
    device: torch.device
    device_group: object = None  # the forward's collectives (NCCL / CNCL / gloo)
    host_group: object = None  # gloo: rank 0's broadcasts of host buffers
    counts: Counter = field(default_factory=Counter)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks, in place."""
        import torch.distributed as dist

        self.counts["all_reduce"] += 1
        _collective(dist.all_reduce, x, group=self.device_group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[*] -> [size, *]: every rank's x, in rank order."""
        import torch.distributed as dist

        self.counts["all_gather"] += 1
        out = x.new_empty(self.size * x.numel())  # the ranks' x one after the other
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        _collective(gather, out, x.reshape(-1), group=self.device_group)
        return out.view(self.size, *x.shape)

    def broadcast(self, t: torch.Tensor) -> None:
        """Rank 0's host tensor t into every other rank's t (same shape), in place."""
        import torch.distributed as dist

        self.counts["broadcast"] += 1
        _collective(dist.broadcast, t, 0, group=self.host_group)

    def broadcast_object(self, obj=None):
        """Rank 0's picklable obj (the others pass None), returned on every rank."""
        import torch.distributed as dist

        self.counts["broadcast_object"] += 1
        box = [obj]
        _collective(dist.broadcast_object_list, box, 0, group=self.host_group)
        return box[0]

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _collective(op, *args, **kwargs) -> None:
    try:
        op(*args, **kwargs)
    except RuntimeError as exc:  # a peer's connection closed, or the wait timed out
        log.error("a collective failed: %s", exc)
        raise RankLost("verifier: a tensor-parallel rank is gone; the request was not "
                       "finished") from exc


def init_group(rank: int, size: int, device: torch.device, address: str,
               timeout_s: float = COLLECTIVE_TIMEOUT_S) -> TPGroup:
    """Join the group whose rank 0 listens on `address` (HOST:PORT; rank 0 opens it). Blocks
    until every rank has joined."""
    import torch.distributed as dist

    dev.set_current(device)
    dist.init_process_group(dev.collective_backend(device), init_method=f"tcp://{address}",
                            rank=rank, world_size=size, timeout=timedelta(seconds=timeout_s))
    host = dist.new_group(backend="gloo", timeout=HOST_TIMEOUT)
    log.info("tensor-parallel rank %d of %d on %s (%s)", rank, size, device,
             dev.collective_backend(device))
    return TPGroup(rank, size, device, dist.group.WORLD, host)


def check_shardable(config, size: int) -> None:
    """ValueError naming the flag when a model's config cannot be split over `size` ranks."""
    from splitspec.lean_llama import LeanDecoder

    if size < 1:
        raise ValueError(f"--tensor-parallel-size must be >= 1, got {size}")
    if size == 1:
        return
    if not LeanDecoder.supports(SimpleNamespace(config=config)):
        raise ValueError(
            f"--tensor-parallel-size {size}: model_type {getattr(config, 'model_type', '?')!r} "
            "runs the transformers forward, which is not sharded; tensor parallelism serves the "
            "lean forward's families (llama, mistral without a sliding window, qwen2)")
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if kv_heads % size:
        raise ValueError(
            f"--tensor-parallel-size {size} does not divide the model's {kv_heads} key/value "
            f"heads: the KV cache is split by KV heads; use a size that divides {kv_heads}")
    if heads % size:
        raise ValueError(f"--tensor-parallel-size {size} does not divide the model's {heads} "
                         "attention heads")


# -- the sharded pieces ---------------------------------------------------------------------


class RowParallel:
    """A row-parallel linear: this rank's input columns, then the sum over the ranks."""

    __slots__ = ("linear", "group")

    def __init__(self, linear: PackedLinear, group: TPGroup):
        self.linear, self.group = linear, group

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.linear(x))


class VocabParallelEmbedding:
    """Token ids [B, S] -> [B, S, H] from this rank's rows [start, start + rows) of the table,
    summed over the ranks."""

    __slots__ = ("weight", "start", "group")

    def __init__(self, weight: torch.Tensor, start: int, group: TPGroup):
        self.weight, self.start, self.group = weight, start, group

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.group.all_reduce(x.masked_fill_(outside[..., None], 0))


class VocabParallelHead:
    """Hidden states [..., H] -> logits [..., V]: this rank's V' vocabulary rows (zero-padded
    past V), gathered from every rank."""

    __slots__ = ("linear", "vocab_size", "group")

    def __init__(self, linear: PackedLinear, vocab_size: int, group: TPGroup):
        self.linear, self.vocab_size, self.group = linear, vocab_size, group

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        parts = self.group.all_gather(self.linear(x))  # [N, ..., V']
        full = parts.movedim(0, -2).reshape(*x.shape[:-1], -1)  # [..., N * V']
        return full[..., :self.vocab_size]


def _vocab_rows(weight: torch.Tensor, group: TPGroup) -> tuple[torch.Tensor, int]:
    """This rank's V' = ceil(V / N) rows of a [V, H] table (zero rows past V) and their start."""
    per = -(-weight.shape[0] // group.size)
    start = group.rank * per
    rows = weight[start:start + per]
    if rows.shape[0] < per:
        rows = torch.cat([rows, rows.new_zeros(per - rows.shape[0], rows.shape[1])])
    return rows, start


@torch.no_grad()
def shard_decoder(lean, group: TPGroup, linear: str = "auto", shard_head: bool = True) -> None:
    """Turn a LeanDecoder built over the whole model (on any device, best with the dense
    backend: nothing packed twice) into this rank's shard on group.device, in place; its matmul
    kernels resolved anew over the shards (`linear`, kernels/linear.py). shard_head=False
    keeps the head whole on every rank (a vocabulary-subset head: small by design); a tied
    embedding then stays whole too."""
    n, r, device = group.size, group.rank, group.device
    d, hq, hkv = lean.head_dim, lean.n_heads, lean.n_kv
    if hq % n or hkv % n:
        raise ValueError(f"{n} ranks do not divide {hq} query / {hkv} key-value heads")
    lq, lkv = hq // n, hkv // n

    def put(t):
        return None if t is None else t.detach().to(device).contiguous()

    # -- which rows / columns of each fused product this rank keeps
    q_rows = torch.arange(r * lq * d, (r + 1) * lq * d)
    kv_rows = torch.arange(r * lkv * d, (r + 1) * lkv * d)
    qkv_rows = torch.cat([q_rows, hq * d + kv_rows, (hq + hkv) * d + kv_rows])
    o_cols = slice(r * lq * d, (r + 1) * lq * d)
    shards = []
    for ln1, qkv, o_proj, ln2, gate_up, down in lean.layers:
        inter = gate_up.weight.shape[0] // 2
        bounds = [len(c) for c in torch.arange(inter).tensor_split(n)]
        lo = sum(bounds[:r])
        gu_rows = torch.cat([torch.arange(lo, lo + bounds[r]),
                             inter + torch.arange(lo, lo + bounds[r])])
        shards.append((put(ln1), _rows(qkv, qkv_rows),
                       (o_proj.weight[:, o_cols], _rank0_bias(o_proj.bias, r)),
                       put(ln2), _rows(gate_up, gu_rows),
                       (down.weight[:, lo:lo + bounds[r]], _rank0_bias(down.bias, r))))
    matrices = [put(w) for s in shards for w, _ in (s[1], s[2], s[4], s[5])]
    backend = resolve(linear, matrices)

    def packed(wb):
        return PackedLinear(put(wb[0]), put(wb[1]), backend)

    lean.layers = [(ln1, packed(qkv), RowParallel(packed(o), group), ln2, packed(gu),
                    RowParallel(packed(down), group))
                   for ln1, qkv, o, ln2, gu, down in shards]
    lean.n_heads, lean.n_kv = lq, lkv
    lean.split_qk_v = ((lq + lkv) * d, lkv * d)
    lean.norm = put(lean.norm)
    lean.linear = backend

    # -- embedding and head: vocabulary-parallel (a tied pair shares its shard)
    head = lean.head
    tied = getattr(head, "weight", None) is not None and \
        head.weight.data_ptr() == lean.embed.data_ptr()
    if shard_head and not hasattr(head, "ids"):
        head_rows, _ = _vocab_rows(head.weight, group)
        head_rows = put(head_rows)
        lean.head = VocabParallelHead(PackedLinear(head_rows, None, backend),
                                      head.weight.shape[0], group)
    else:  # whole on every rank (a subset head: its own rows only)
        head_rows = None
        if hasattr(head, "ids"):
            head.ids = head.ids.to(device)
            head.linear = PackedLinear(put(head.linear.weight), None, backend)
        else:
            lean.head = PackedLinear(put(head.weight), None, backend)
    if tied and head_rows is not None:
        lean.embed, start = head_rows, r * head_rows.shape[0]
    elif tied or not shard_head:
        lean.embed, start = put(lean.embed), None
    else:
        rows, start = _vocab_rows(lean.embed, group)
        lean.embed = put(rows)
    if start is not None:
        lean.embed_tokens = VocabParallelEmbedding(lean.embed, start, group)
    lean._rope_tables = lean._rope_for(lean.embed.dtype, device)


def _rows(linear: PackedLinear, rows: torch.Tensor):
    """(weight, bias) of a column-parallel product: the output rows `rows`."""
    rows = rows.to(linear.weight.device)
    return (linear.weight.index_select(0, rows),
            None if linear.bias is None else linear.bias.index_select(0, rows))


def _rank0_bias(bias, rank: int):
    """A row-parallel product's bias is added once: by rank 0 (zeros elsewhere)."""
    if bias is None or rank == 0:
        return bias
    return torch.zeros_like(bias)


def release_weights(model) -> None:
    """Drop a model's own parameters and buffers (moved to the meta device): after sharding, the
    rank keeps only its shards; the module keeps its config."""
    model.to("meta")


def weight_bytes(lean) -> int:
    """Bytes of the weights a (possibly sharded) LeanDecoder computes with: embedding, norms,
    every product's weight and bias, the head; each tensor counted once (a tied head is the
    embedding). Packed copies of the CPU's matmul kernels are not counted; a weight a packed
    product let go of (a meta tensor, LeanDecoder.release_dense) counts as its shape says."""
    seen: dict[object, int] = {}

    def add(t):
        if t is not None:
            key = ("released", id(t)) if t.device.type == "meta" else t.data_ptr()
            seen[key] = t.numel() * t.element_size()

    def add_linear(lin):
        lin = getattr(lin, "linear", lin)  # RowParallel
        add(lin.weight)
        add(lin.bias)

    add(lean.embed)
    add(lean.norm)
    for ln1, qkv, o, ln2, gu, down in lean.layers:
        add(ln1)
        add(ln2)
        for lin in (qkv, o, gu, down):
            add_linear(lin)
    head = lean.head
    add_linear(getattr(head, "linear", head))
    return sum(seen.values())
