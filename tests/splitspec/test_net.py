"""Port allocation for local stacks: distinct within a process, bindable when handed out, outside
the kernel's ephemeral range, and reserved against other processes."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from splitspec.launcher import REPO_ROOT, Stack
from splitspec.net import PortAllocator, bindable, ephemeral_range, free_port


def test_free_port_never_repeats_and_each_port_is_bindable():
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    eph_low, eph_high = ephemeral_range()
    for port in ports:
        assert bindable("127.0.0.1", port)
        # bind(0) and outgoing connections take ports from the ephemeral range: never these
        assert not eph_low <= port <= eph_high


def test_a_port_with_a_listener_is_never_handed_out(tmp_path):
    port = free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen(1)
        assert not bindable("127.0.0.1", port)
        with pytest.raises(RuntimeError, match="no free port"):
            PortAllocator(port, port, lock_dir=tmp_path).allocate()
    allocator = PortAllocator(port, port, lock_dir=tmp_path / "again")
    assert allocator.allocate() == port  # free again now
    with pytest.raises(RuntimeError, match="no free port"):
        allocator.allocate()  # but never handed out twice


def test_another_process_never_gets_a_reserved_port(tmp_path):
    port = free_port()
    low, high = port, port
    mine = PortAllocator(low, high, lock_dir=tmp_path)
    assert mine.allocate() == port
    def allocate_elsewhere(lock_dir) -> str:
        code = ("from pathlib import Path; from splitspec.net import PortAllocator\n"
                f"a = PortAllocator({low}, {high}, lock_dir=Path({str(lock_dir)!r}))\n"
                "try:\n    print(a.allocate())\nexcept RuntimeError:\n    print('none')\n")
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=Stack.environment(),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert allocate_elsewhere(tmp_path) == "none"  # held by this process: not handed out there
    assert allocate_elsewhere(tmp_path / "unrelated") == str(port)  # without the reservation
