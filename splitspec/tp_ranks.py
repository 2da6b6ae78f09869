"""Starting and watching the other ranks of a tensor-parallel service.

A service started with `--tensor-parallel-size N` is rank 0 (it serves gRPC) and starts ranks
1 .. N-1 itself, one process per device of this host (`start_ranks`), which join its group at
`address` (splitspec/tensor_parallel.py). Or, across hosts (a Kubernetes LeaderWorkerSet, one pod
per host), each host's process starts the ranks of its own devices and rank 0's host serves: see
`--tensor-parallel-nodes` (docs/deploy.md).

A rank process follows the process that started it: it dies with it (PR_SET_PDEATHSIG), and it
ignores SIGINT and SIGTERM (rank 0 drains first, then tells it to stop). The starting process
watches its ranks: one that exits while the group serves is a lost rank (`RankProcesses.watch`),
and the service exits non-zero so that its supervisor or Kubernetes restarts the whole group.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
from typing import Callable, Sequence

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class RankProcesses:
    """Rank processes this process started (rank -> process)."""

    def __init__(self, procs: dict[int, multiprocessing.Process]):
        self.procs = procs
        self._stopping = False

    def watch(self, on_exit: Callable[[int, int | None], None]) -> None:
        """Call on_exit(rank, exit code) from a watcher thread when a rank exits before stop()."""
        def run():
            by_sentinel = {p.sentinel: r for r, p in self.procs.items()}
            while by_sentinel and not self._stopping:
                for sentinel in multiprocessing.connection.wait(list(by_sentinel)):
                    rank = by_sentinel.pop(sentinel)
                    proc = self.procs[rank]
                    proc.join(1.0)  # reaped: its exit code is known
                    if not self._stopping:
                        on_exit(rank, proc.exitcode)

        if self.procs:
            threading.Thread(target=run, name="tp-rank-watch", daemon=True).start()

    def stop(self, timeout: float = 10.0) -> None:
        """Wait for the ranks to exit (after rank 0 told them to), killing stragglers."""
        self._stopping = True
        for proc in self.procs.values():
            proc.join(timeout)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def exit_codes(self) -> dict[int, int | None]:
        return {r: p.exitcode for r, p in self.procs.items()}


def start_ranks(entry: Callable, args: tuple, ranks: Sequence[int]) -> RankProcesses:
    """Start entry(*args, rank) in a fresh interpreter for each rank."""
    ctx = multiprocessing.get_context("spawn")
    procs = {r: ctx.Process(target=entry, args=(*args, r), name=f"tp-rank-{r}", daemon=True)
             for r in ranks}
    for p in procs.values():
        p.start()
    return RankProcesses(procs)


def enter_rank(rank: int, log_level: str = "INFO") -> None:
    """First thing in a rank process: die with the process that started it, leave SIGINT and
    SIGTERM to rank 0, and log with the rank in each line."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the starting process is gone already
            os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level.upper(),
                        format=f"%(asctime)s %(levelname)s [rank {rank}] %(name)s: %(message)s")


def exit_now(code: int, message: str) -> None:
    """Log, flush and leave at once (a thread may be blocked in a collective that will never
    finish: the interpreter's normal exit would wait for it)."""
    log.error(message)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
