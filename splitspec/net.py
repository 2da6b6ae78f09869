"""Small networking helpers: ports for local stacks and waiting for a listener.

`free_port` hands out ports for services started on this machine (`StackConfig.with_free_ports`,
the test suite). A port picked by binding port 0 and closing the socket again is only free *for
now*: the kernel may give it to the next caller of bind(0) or to an outgoing connection before the
service binds it, and gRPC servers (SO_REUSEPORT) may even share it silently. So `PortAllocator`:

- picks ports below the kernel's ephemeral range (never handed out by bind(0) or used as the source
  port of a connection), falling back to kernel-chosen ports only when there is no such room;
- never hands out the same port twice in one process (a stack restarted on its ports keeps them);
- checks that each port is bindable right now (nothing listens on it);
- reserves each port across processes on this machine with a lock file held for the life of the
  process, so concurrent test sessions never pick the same port.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import threading
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # not on POSIX: no cross-process reservation
    fcntl = None  # type: ignore[assignment]

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 20000  # below this: well-known and registered service ports, left alone
LOCK_DIR = Path(tempfile.gettempdir()) / "splitspec-ports"


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for bind(0) and outgoing connections (Linux), else IANA's."""
    try:
        low, high = EPHEMERAL_RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def bindable(host: str, port: int) -> bool:
    """Whether a listener could bind host:port now (SO_REUSEADDR as servers set it, so that
    connections still in TIME_WAIT do not count, but a listener does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError:
            return False
    return True


class PortAllocator:
    """Hands out distinct, bindable, reserved ports; see the module docstring.

    `low`..`high` (inclusive) is the range to pick from; by default the ports between
    LOWEST_PORT and the start of the ephemeral range, or, where the kernel leaves no such room,
    ports chosen by the kernel (bind to port 0) under the same rules.
    """

    MIN_DEFAULT_RANGE = 1000

    def __init__(self, low: int | None = None, high: int | None = None,
                 lock_dir: Path | None = LOCK_DIR):
        if low is None or high is None:
            low, high = LOWEST_PORT, ephemeral_range()[0] - 1
            if high - low + 1 < self.MIN_DEFAULT_RANGE:
                low = high = 0  # 0: the kernel chooses
        if high < low:
            raise ValueError(f"empty port range {low}-{high}")
        self.low, self.high = low, high
        self._lock_dir = lock_dir if fcntl is not None else None
        self._lock_dir_checked = False
        self._given: set[int] = set()
        self._locks: list[int] = []  # open lock-file descriptors: held until the process exits
        self._mutex = threading.Lock()
        self._next = random.SystemRandom().randrange(low, high + 1)

    def allocate(self, host: str = "127.0.0.1") -> int:
        with self._mutex:
            size = self.high - self.low + 1
            for _ in range(size if self.low else 1000):
                if self.low:
                    port = self._next
                    self._next = self.low + (port + 1 - self.low) % size
                else:
                    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                        s.bind((host, 0))
                        port = s.getsockname()[1]
                if self._take(host, port):
                    return port
            raise RuntimeError(f"no free port left in {self.low}-{self.high}" if self.low
                               else "could not find a free port")

    def _take(self, host: str, port: int) -> bool:
        if port in self._given or not self._reserve(port):
            return False
        self._given.add(port)  # never again in this process, even if not bindable now
        return bindable(host, port)

    def _reserve(self, port: int) -> bool:
        if not self._lock_dir_usable():
            return True
        try:
            fd = os.open(self._lock_dir / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        except PermissionError:
            return False  # another user's reservation
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # another process holds it
            return False
        self._locks.append(fd)
        return True

    def _lock_dir_usable(self) -> bool:
        """Shared by every user of this machine (sticky and world-writable, like /tmp itself);
        where it cannot be written, ports are still checked, just not reserved."""
        if self._lock_dir is None or self._lock_dir_checked:
            return self._lock_dir is not None
        self._lock_dir_checked = True
        try:
            self._lock_dir.mkdir(parents=True, exist_ok=True)
            if self._lock_dir.stat().st_uid == os.getuid():
                os.chmod(self._lock_dir, 0o1777)
        except OSError:
            pass
        if not os.access(self._lock_dir, os.W_OK | os.X_OK):
            self._lock_dir = None
        return self._lock_dir is not None


_allocator: PortAllocator | None = None
_allocator_mutex = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port for a local service: distinct within this process, bindable now, and reserved
    against other processes that allocate ports with this module."""
    global _allocator
    with _allocator_mutex:
        if _allocator is None:
            _allocator = PortAllocator()
    return _allocator.allocate(host)


def wait_for_port(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False
