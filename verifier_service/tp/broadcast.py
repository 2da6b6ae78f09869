"""What rank 0 of a tensor-parallel verifier sends the other ranks: each step's plan and the KV
cache operations since the one before, in ONE host buffer, with ONE broadcast per step.

The other ranks run no scheduler, sampler or proposer (verifier_service/tp/worker.py). A step,
for them, is the plan's arrays (verifier_service/step/plan.py) plus the few host-side facts the
step body reads (the bucket, the longest context, a context that is one run of slots, an exact
tree step's ancestor relation), and the cache operations rank 0 did on its own shard between two
steps (blocks zeroed as they are handed out, kept rows moved after a tree step), which every
rank repeats on its shard, in the same order, before the step. Nothing crosses between ranks
inside the forward but its own collectives (splitspec/tensor_parallel.py).

    header    [HEADER]   op, length, the plan's sizes (T B NB R L S K O), bucket, longest
                         context, context range, ancestor shape, journal length, block size
    plan      [total]    the plan's host buffer as is
    ancestors            an exact tree step's [B, R, R] relation, 64 bits to an int64
    journal              (ZERO, n, block ids...) and (MOVE, n, sources..., destinations...)

Both sides keep a buffer of the same capacity (INITIAL_CAPACITY to start) and broadcast all of
it. A longer message goes out as its first `capacity` elements and then the rest, and both sides
grow the capacity to the next power of two that holds it: after the first long prefill, every
step is one broadcast again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from splitspec.tensor_parallel import TPGroup
from verifier_service.kv.journal import JournaledKVCache
from verifier_service.step.plan import Bucket, PlanFields

__all__ = ["CAPTURE", "STEP", "STOP", "Message", "PlanBroadcast", "PlanReceiver", "RemotePlan"]

STEP, CAPTURE, STOP = 1, 2, 3
SIZES = ("T", "B", "NB", "R", "L", "S", "K", "O")
HEADER = 20
# 32 KiB: a decode step of 8 sequences with 8 drafts each over a 4096-token context fits
INITIAL_CAPACITY = 1 << 12


@dataclass
class RemotePlan:
    """A step plan as another rank sees it: what the step body (PagedBatch.from_plan,
    StepExecutor.launch) reads of a StepPlan."""

    bucket: Bucket | None
    block_size: int
    fields: PlanFields
    host: torch.Tensor  # int64 [fields.total]
    max_context: int
    context_range: tuple[int, int] | None
    ancestors: torch.Tensor | None


@dataclass
class Message:
    op: int
    plan: RemotePlan | None
    journal: np.ndarray


def encode(op: int, plan, journal: np.ndarray) -> np.ndarray:
    """One message: header, then the plan's buffer, ancestors and the journal."""
    head = np.zeros(HEADER, dtype=np.int64)
    head[0] = op
    parts = [head]
    if plan is not None:
        sizes = dict(plan.fields.sizes)
        head[2:10] = [sizes[n] for n in SIZES]
        if plan.bucket is not None:
            head[10:12] = plan.bucket.num_seqs, plan.bucket.rows
        head[12] = plan.max_context
        head[13:15] = plan.context_range if plan.context_range is not None else (-1, -1)
        head[19] = plan.block_size
        parts.append(plan.host.numpy())
        if plan.ancestors is not None:
            anc = plan.ancestors.numpy().astype(bool)
            head[15:18] = anc.shape
            bits = np.packbits(anc.reshape(-1))
            parts.append(np.pad(bits, (0, -len(bits) % 8)).view(np.int64))
    head[18] = len(journal)
    parts.append(journal)
    msg = np.concatenate(parts)
    msg[1] = len(msg)
    return msg


def decode(msg: torch.Tensor) -> Message:
    """The inverse of encode, over a host int64 tensor (the plan's buffer is a view of it)."""
    head = msg[:HEADER].tolist()
    op, at = head[0], HEADER
    plan = None
    if op == STEP:
        fields = PlanFields.of(**dict(zip(SIZES, head[2:10])))
        host = msg[at:at + fields.total]
        at += fields.total
        ancestors = None
        if head[15]:
            shape = tuple(head[15:18])
            count = int(np.prod(shape))
            words = -(-count // 64)
            bits = msg[at:at + words].numpy().view(np.uint8)
            ancestors = torch.from_numpy(
                np.unpackbits(bits)[:count].astype(bool).reshape(shape))
            at += words
        plan = RemotePlan(Bucket(head[10], head[11]) if head[10] else None, head[19], fields,
                          host, head[12], None if head[13] < 0 else (head[13], head[14]),
                          ancestors)
    return Message(op, plan, msg[at:at + head[18]].numpy())


class _Channel:
    """Rank 0's host buffers to every rank, `capacity` elements per broadcast (see above)."""

    def __init__(self, group: TPGroup, capacity: int = INITIAL_CAPACITY):
        self.group = group
        self.capacity = capacity
        self.buf = torch.zeros(capacity, dtype=torch.int64)

    def _grow(self, n: int) -> None:
        if n > self.capacity:
            self.capacity = 1 << (n - 1).bit_length()
            self.buf = torch.zeros(self.capacity, dtype=torch.int64)

    def send(self, msg: np.ndarray) -> None:
        n, cap = len(msg), self.capacity
        if n <= cap:
            self.buf.numpy()[:n] = msg
            self.group.broadcast(self.buf)
            return
        self.group.broadcast(torch.from_numpy(msg[:cap]))
        self.group.broadcast(torch.from_numpy(msg[cap:]))
        self._grow(n)

    def receive(self) -> torch.Tensor:
        self.group.broadcast(self.buf)
        n, cap = int(self.buf[1]), self.capacity
        if n <= cap:
            return self.buf[:n]
        rest = torch.empty(n - cap, dtype=torch.int64)
        self.group.broadcast(rest)
        msg = torch.cat([self.buf, rest])
        self._grow(n)
        return msg


class PlanBroadcast:
    """Rank 0's side: StepExecutor.broadcast (verifier_service/step/executor.py)."""

    def __init__(self, group: TPGroup, kv: JournaledKVCache):
        self.kv = kv
        self.steps = 0
        self._channel = _Channel(group)

    def step(self, plan) -> None:
        self.steps += 1
        self._channel.send(encode(STEP, plan, self.kv.take_journal()))

    def capture(self) -> None:
        self._channel.send(encode(CAPTURE, None, self.kv.take_journal()))

    def stop(self) -> None:
        self._channel.send(encode(STOP, None, self.kv.take_journal()))


class PlanReceiver:
    """Another rank's side: the next message, blocking until rank 0 sends one."""

    def __init__(self, group: TPGroup):
        self._channel = _Channel(group)

    def next(self) -> Message:
        return decode(self._channel.receive())
