"""A draft-model proposer split over N devices: `splitspec-proposer --method draft
--tensor-parallel-size N`, independent of the verifier's own size (a 1B-7B draft at TP 2-4 beside
a larger target).

Every rank holds the draft's lean forward sharded exactly as a verifier's target is
(splitspec/tensor_parallel.py: column- and row-parallel products, vocabulary-parallel
embedding and head; a vocabulary-subset head stays whole on every rank), and its sequences' KV
caches hold the rank's KV heads. Rank 0 serves gRPC; the process starts ranks 1 .. N-1 itself
(splitspec/tp_ranks.py).

A draft step is host logic between forwards (catch-ups, the padded batch cache, the sampler's
choices fed back), so every rank runs the whole session, in step: rank 0 broadcasts each
session call (propose, release, close, with the session it belongs to) before making it, and
the other ranks make the same call on their own sessions. The forwards' collectives meet, and
the gathered logits are the same on every rank, so are the choices. What could make ranks
diverge is kept out: drafting ahead (it races the verifier's next message) is off at TP > 1;
idle sequences are forgotten by rank 0's clock and the others are told (a release); random
numbers come from generators seeded alike for every call (rank 0 draws the seed and sends it
with the call).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time

import torch

from proposer_service.base import Proposer, ProposerSession
from proposer_service.config import ProposerConfig
from splitspec.device import rank_device, resolve_device
from splitspec.net import free_port
from splitspec.tensor_parallel import (
    RankLost,
    TPGroup,
    check_shardable,
    init_group,
    release_weights,
    shard_decoder,
    weight_bytes,
)
from splitspec.tp_ranks import RankProcesses, enter_rank, exit_now, start_ranks

log = logging.getLogger(__name__)


def load_shard(config: ProposerConfig, group: TPGroup) -> Proposer:
    """This rank's draft proposer: the model loaded onto the rank's device, its lean forward
    sharded, the whole weights released; drafting ahead off, no idle clock of its own."""
    from proposer_service.draft.proposer import DraftModelProposer

    inner = DraftModelProposer.from_config(dataclasses.replace(config, device=str(group.device)))
    if inner.lean is None:
        raise SystemExit("error: --tensor-parallel-size needs a Llama-family draft (the lean "
                         "forward)")
    subset = hasattr(inner.lean.head, "ids")
    shard_decoder(inner.lean, group, config.linear, shard_head=not subset)
    release_weights(inner.model)
    inner.drafts_ahead = False
    inner.idle_timeout_s = float("inf")
    log.info("draft shard on %s: %.1f MiB of weights", group.device,
             weight_bytes(inner.lean) / 2**20)
    return inner


class TPDraftProposer(Proposer):
    """Rank 0's proposer: its sessions broadcast each call to the other ranks first."""

    def __init__(self, inner: Proposer, group: TPGroup, ranks: RankProcesses,
                 idle_timeout_s: float):
        self.inner, self.group, self.ranks = inner, group, ranks
        self.idle_timeout_s = idle_timeout_s
        self._lock = threading.Lock()  # one call at a time, in the order the ranks see
        self._next_id = 0
        self._sessions: dict[int, ProposerSession] = {}  # rank 0's own, by session id

    def describe(self):
        return self.inner.describe()

    def open_session(self) -> ProposerSession:
        with self._lock:
            self._next_id += 1
            return _Session(self, self._next_id)

    def call(self, sid: int, op: str, *args):
        """Broadcast the call (with the seed its random numbers come from), then make it here;
        under the lock."""
        seed = secrets.randbits(63)
        self.group.broadcast_object((sid, op, args, seed))
        return _apply(self._sessions, self.inner, sid, op, args, seed)

    def stop(self) -> None:
        """Tell the other ranks to exit, then wait for them."""
        with self._lock:
            try:
                self.group.broadcast_object((0, "stop", (), 0))
            except RankLost:
                pass
        self.ranks.stop()
        self.group.close()


def _apply(sessions: dict, inner: Proposer, sid: int, op: str, args, seed: int):
    """One session call on this rank (every rank runs the same ones in the same order, their
    unseeded sampled drafts drawn from the same generator state)."""
    if op == "propose":
        torch.manual_seed(seed)
        evicted, steps = args
        session = sessions.setdefault(sid, inner.open_session())
        if evicted:
            session.release(evicted)
        return session.propose(steps)
    if op == "release":
        session = sessions.get(sid)
        if session is not None:
            session.release(*args)
        return None
    if op == "close":
        session = sessions.pop(sid, None)
        if session is not None:
            session.close()
        return None
    raise ValueError(f"unknown session call {op!r}")


class _Session(ProposerSession):
    """Rank 0's session: tracks idleness by its own clock, and sends every call first."""

    def __init__(self, proposer: TPDraftProposer, sid: int):
        self._p, self._sid = proposer, sid
        self._seen: dict[str, float] = {}

    def propose(self, steps):
        now = time.monotonic()
        evicted = [s for s, t in self._seen.items() if now - t > self._p.idle_timeout_s]
        for s in evicted:
            del self._seen[s]
        for step in steps:
            self._seen[step.seq_id] = now
        with self._p._lock:
            return self._p.call(self._sid, "propose", evicted, steps)

    def release(self, seq_ids):
        if not seq_ids:
            return
        for s in seq_ids:
            self._seen.pop(s, None)
        with self._p._lock:
            self._p.call(self._sid, "release", list(seq_ids))

    def close(self):
        with self._p._lock:
            self._p.call(self._sid, "close")


def start(config: ProposerConfig) -> TPDraftProposer:
    """Rank 0 of a split draft: check the model, start the other ranks, join their group, load
    this rank's shard. A rank that exits ends this process too (exit code 1): its verifiers
    decode without this proposer until it is back."""
    from transformers import AutoConfig

    size = config.tensor_parallel_size
    if config.method != "draft":
        raise SystemExit(f"error: --tensor-parallel-size serves the draft method, not "
                         f"{config.method!r}")
    if not config.model:
        raise SystemExit("error: --method draft needs --model DIR")
    try:
        check_shardable(AutoConfig.from_pretrained(config.model, local_files_only=True,
                                                   trust_remote_code=config.trust_remote_code),
                        size)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    address = f"127.0.0.1:{free_port()}"
    ranks = start_ranks(run_rank, (config, address), range(1, size))
    ranks.watch(lambda rank, code: exit_now(1, f"draft proposer: tensor-parallel rank {rank} "
                                               f"exited with code {code}"))
    group = init_group(0, size, rank_device(resolve_device(config.device), 0), address)
    return TPDraftProposer(load_shard(config, group), group, ranks, config.idle_timeout_s)


def run_rank(config: ProposerConfig, address: str, rank: int) -> None:
    """A rank other than 0: load the shard, make rank 0's session calls until it says stop."""
    enter_rank(rank, config.log_level)
    try:
        group = init_group(rank, config.tensor_parallel_size,
                           rank_device(resolve_device(config.device), rank), address)
        inner = load_shard(config, group)
        sessions: dict[int, ProposerSession] = {}
        while True:
            sid, op, args, seed = group.broadcast_object()
            if op == "stop":
                break
            with torch.inference_mode():
                _apply(sessions, inner, sid, op, args, seed)
    except RankLost:
        exit_now(1, "draft proposer: rank 0 is gone")
    except Exception:  # noqa: BLE001 - any failure of a rank ends the group
        log.exception("draft proposer rank %d failed", rank)
        exit_now(1, f"draft proposer: tensor-parallel rank {rank} failed")
    group.close()
