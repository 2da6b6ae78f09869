"""Where one proposer method's processes are: `--proposer METHOD=TARGET` resolved to addresses.

TARGET is `HOST:PORT` or a comma-separated list of them (`10.0.0.5:50052,10.0.0.6:50052`, or
`[::1]:50052` for IPv6). A HOST may be a name with several addresses: a Kubernetes headless
Service answers with the address of every ready pod, so one name stands for a whole pool and
resolving it again tells which pods came and went. Each address found is one pool member.

A name with both IPv4 and IPv6 addresses (dual-stack pods, `localhost`) would count every
process twice; the IPv4 addresses are used when there are any, else the IPv6 ones.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Awaitable, Callable

# (host, port) -> member addresses "IP:PORT"; raises OSError when the name does not resolve.
Resolver = Callable[[str, int], Awaitable[list[str]]]


def split_target(target: str) -> list[tuple[str, int]]:
    """`h1:p1,h2:p2` -> [(h1, p1), (h2, p2)]. Raises ValueError naming the bad entry."""
    entries = []
    for raw in target.split(","):
        entry = raw.strip()
        host, sep, port = entry.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected HOST:PORT, got {entry!r}")
        entries.append((host, int(port)))
    return entries


def format_address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def resolve_dns(host: str, port: int) -> list[str]:
    """Every address of `host` (one family, see the module docstring), sorted."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    v4 = {info[4][0] for info in infos if info[0] == socket.AF_INET}
    v6 = {info[4][0] for info in infos if info[0] == socket.AF_INET6}
    return [format_address(ip, port) for ip in sorted(v4 or v6)]
