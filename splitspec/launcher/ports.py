"""The ports of a local stack: defaults that never collide, and clashes refused by name.

Defaults: the gateway's REST port 8000 and gRPC port 50050, the first verifier 50051, each
proposer its port in the method registry (splitspec/methods.py, 50052 up), metrics consecutive
from 9400. Further verifier replicas take the next ports above the first verifier's that no
other service of the stack has, so no number of replicas or proposers makes the defaults
collide. A port given explicitly to two services is refused, naming both.
"""

from __future__ import annotations

from typing import Collection, Iterable, Sequence

MAX_PORT = 65535


def replica_ports(first: int, count: int, given: Sequence[int] = (),
                  taken: Collection[int] = ()) -> list[int]:
    """The gRPC port of each of `count` verifier replicas: `first`, then the `given` ones, then
    the next ports above `first` that are neither among them nor `taken` by another service."""
    ports = [first, *given[:count - 1]]
    candidate = first
    while len(ports) < count:
        candidate += 1
        if candidate > MAX_PORT:
            raise ValueError(f"no port above {first} left for {count} verifier replicas")
        if candidate not in taken and candidate not in ports:
            ports.append(candidate)
    return ports


def check_distinct(assigned: Iterable[tuple[str, int]]) -> None:
    """Raise ValueError naming the first port given to two services ((what, port) pairs;
    port 0 means none)."""
    owner: dict[int, str] = {}
    for what, port in assigned:
        if not port:
            continue
        if port in owner:
            raise ValueError(f"port {port} is given to two services: {owner[port]} and {what}")
        owner[port] = what
