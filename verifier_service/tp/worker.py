"""The ranks of a tensor-parallel verifier (`--tensor-parallel-size N`).

Rank 0 is the verifier as always (gRPC, engine, scheduler, proposers, samplers) over its shard
of the target; `start_group` starts ranks 1 .. N-1 (splitspec/tp_ranks.py) and joins their
group. Each other rank is this file's `run_rank`: it loads its shard (splitspec/
tensor_parallel.py) and its KV cache of H_kv / N heads, then `follow`s rank 0: per message
(verifier_service/tp/broadcast.py) it repeats rank 0's cache operations on its shard and runs
the same step body (StepExecutor.launch: the captured graph of the plan's bucket where the
device has graphs, each rank capturing its own when rank 0 does), taking part in the forward's
all-reduces. It holds no request and reads nothing back. Ranks exit when rank 0 says stop (exit
code 0), or when rank 0 is gone (a collective fails: exit code 1; or the kernel's death signal).

Across hosts (`--tensor-parallel-nodes M`), every host runs N / M ranks: host 0 is rank 0's and
serves; any other host runs `serve_node`, which only starts its ranks and waits for them.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from splitspec.device import rank_device, resolve_device
from splitspec.net import free_port
from splitspec.tensor_parallel import RankLost, TPGroup, check_shardable, init_group
from splitspec.tp_ranks import RankProcesses, enter_rank, exit_now, start_ranks
from verifier_service.config import VerifierConfig
from verifier_service.kv.journal import replay_journal
from verifier_service.model.target import build_runner
from verifier_service.step.executor import StepExecutor
from verifier_service.tp.broadcast import CAPTURE, STOP, PlanReceiver

log = logging.getLogger("splitspec.verifier")


@dataclasses.dataclass
class Layout:
    """Where the ranks run: `per_node` ranks on each of `nodes` hosts."""

    size: int
    nodes: int
    node_rank: int

    @classmethod
    def of(cls, config: VerifierConfig) -> "Layout":
        size, nodes = config.tensor_parallel_size, config.tensor_parallel_nodes
        if size < 1 or nodes < 1 or size % nodes:
            raise ValueError(f"--tensor-parallel-size {size} must be a multiple of "
                             f"--tensor-parallel-nodes {nodes} (ranks per host)")
        if not 0 <= config.tensor_parallel_node_rank < nodes:
            raise ValueError(f"--tensor-parallel-node-rank must be in [0, {nodes})")
        if nodes > 1 and not config.tensor_parallel_address:
            raise ValueError("--tensor-parallel-nodes > 1 needs --tensor-parallel-address "
                             "HOST:PORT (where rank 0's host listens for the others)")
        return cls(size, nodes, config.tensor_parallel_node_rank)

    @property
    def per_node(self) -> int:
        return self.size // self.nodes

    def local_ranks(self) -> range:
        return range(self.node_rank * self.per_node, (self.node_rank + 1) * self.per_node)


def check_model(config: VerifierConfig) -> None:
    """Refuse, before any rank starts, a target that cannot be split this way."""
    from transformers import AutoConfig

    from splitspec.modelio import require_local_dir

    path = require_local_dir(config.model)
    cfg = AutoConfig.from_pretrained(path, local_files_only=True,
                                     trust_remote_code=config.trust_remote_code)
    check_shardable(cfg, config.tensor_parallel_size)


def _device(config: VerifierConfig, rank: int, layout: Layout) -> torch.device:
    return rank_device(resolve_device(config.device), rank % layout.per_node)


def start_group(config: VerifierConfig, on_exit) -> tuple[TPGroup, RankProcesses]:
    """Rank 0: start this host's other ranks, watch them (on_exit(rank, exit code) from a
    watcher thread), and join the group (blocks until every rank has joined)."""
    layout = Layout.of(config)
    check_model(config)
    if not config.tensor_parallel_address:
        config = dataclasses.replace(config, tensor_parallel_address=f"127.0.0.1:{free_port()}")
    ranks = start_ranks(run_rank, (config,), layout.local_ranks()[1:])
    ranks.watch(on_exit)
    return init_group(0, layout.size, _device(config, 0, layout),
                      config.tensor_parallel_address), ranks


def serve_node(config: VerifierConfig) -> int:
    """A host other than rank 0's: start its ranks and wait; the exit code is theirs (non-zero
    when one failed, so that its orchestrator restarts it)."""
    layout = Layout.of(config)
    ranks = start_ranks(run_rank, (config,), layout.local_ranks())
    failed = []
    ranks.watch(lambda rank, code: failed.append((rank, code)))
    while not failed and any(p.is_alive() for p in ranks.procs.values()):
        time.sleep(0.5)
    if failed and failed[0][1]:
        exit_now(1, f"tensor-parallel rank {failed[0][0]} exited with code {failed[0][1]}")
    ranks.stop()
    return max((c or 0 for c in ranks.exit_codes().values()), default=0)


def run_rank(config: VerifierConfig, rank: int) -> None:
    """A rank process other than rank 0: load the shard, follow rank 0 until it says stop."""
    enter_rank(rank, config.log_level)
    layout = Layout.of(config)
    try:
        group = init_group(rank, layout.size, _device(config, rank, layout),
                           config.tensor_parallel_address)
        runner, _, _ = build_runner(config, group)
        executor = StepExecutor.for_config(runner, config)
        steps = follow(PlanReceiver(group), runner.kv, executor)
    except RankLost as exc:
        exit_now(1, f"rank 0 is gone: {exc}")
    except Exception:  # noqa: BLE001 - any failure of a rank ends the group
        log.exception("tensor-parallel rank %d failed", rank)
        exit_now(1, f"tensor-parallel rank {rank} failed")
    log.info("rank %d stopped after %d steps", rank, steps)
    group.close()


def follow(receiver: PlanReceiver, kv, executor: StepExecutor) -> int:
    """Run rank 0's messages on this rank's shard until it says stop; returns the steps run."""
    steps = 0
    while True:
        msg = receiver.next()
        replay_journal(kv, msg.journal)
        if msg.op == STOP:
            return steps
        if msg.op == CAPTURE:
            executor.capture()
            continue
        with torch.inference_mode():
            executor.launch(msg.plan)
        steps += 1

