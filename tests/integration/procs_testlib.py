"""The processes a launcher started, read from /proc (Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def children_of(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited; it only waits to be reaped
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def proposer_port_flags() -> list[str]:
    """A free port for every registered proposer method (none of the fixed defaults)."""
    from splitspec.methods import proposer_methods
    from splitspec.net import free_port

    return [a for m in proposer_methods() for a in (f"--{m}-port", str(free_port()))]


def stop_launcher(proc: subprocess.Popen) -> None:
    """Stop a launcher that may still run as Ctrl-C would, killing it when it does not exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
