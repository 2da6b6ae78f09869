"""How many torch (OpenMP) threads each process of a local stack gets by default.

On one host the verifier and the proposers share the cores. The verifier's step is what every
request waits for, so it gets the most: its replicas (and tensor-parallel ranks) split the cores
between them. A proposer with a model of its own (draft, mlp) drafts beside the verifier's step
(drafting ahead) and gets a quarter of the cores, at least 1 and never more than a verifier.
The CPU-trivial processes (the gateway, the n-gram and suffix proposers: no model) get 1.

    plan_threads(2, {"verifier": VERIFIER, "proposer-draft": DRAFTER, "gateway": LIGHT})
    == {"verifier": 2, "proposer-draft": 1, "gateway": 1}

A drafter's threads are not taken from the verifier's: a drafter is idle for every request
that does not use it (speculation off, another method), and then the verifier should have every
core. The launcher passes each number as the process's OMP_NUM_THREADS (splitspec/launcher/
stack.py), which is torch's default thread count; a service's own --threads flag wins over it,
and an OMP_NUM_THREADS already set in the launcher's environment is left as it is for every
service. The Helm chart derives the same variable from each container's CPU limit (else its
request) by threads_for_cpus' rule, 1 for the CPU-trivial ones (splitspec.threads in
k8s/splitspec/templates/_helpers.tpl; tests/k8s/test_chart_threads.py holds them equal).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

THREADS_ENV = "OMP_NUM_THREADS"

VERIFIER = "verifier"  # the target's forward: the critical path of every step
DRAFTER = "drafter"  # a proposer with a model: drafts beside the verifier's step
LIGHT = "light"  # the gateway, proposers without a model: I/O and bookkeeping
ROLES = (VERIFIER, DRAFTER, LIGHT)


def host_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0))


def threads_for_cpus(cpus: float) -> int:
    """Threads for a budget of `cpus` cores: whole cores only (a thread on a fraction of a core
    waits for the rest), at least 1."""
    return max(1, math.floor(cpus))


def plan_threads(cores: int, services: Mapping[str, str],
                 ranks_per_verifier: int = 1) -> dict[str, int]:
    """Service name -> its threads, for `cores` cores and `services` (name -> role). Each
    verifier service runs ranks_per_verifier processes (tensor-parallel ranks), each with the
    threads given for it."""
    unknown = {r for r in services.values() if r not in ROLES}
    if unknown:
        raise ValueError(f"unknown role(s) {sorted(unknown)}; known: {', '.join(ROLES)}")
    processes = max(1, sum(r == VERIFIER for r in services.values()) * ranks_per_verifier)
    verifier = threads_for_cpus(cores / processes)
    drafter = min(verifier, threads_for_cpus(cores / 4))
    share = {VERIFIER: verifier, DRAFTER: drafter, LIGHT: 1}
    return {name: share[role] for name, role in services.items()}
