"""The local launcher app: `splitspec serve MODEL` (vLLM's flag names) and `splitspec up` (every
switch spelled out) start the whole stack on this machine, one process per service, and keep
it running.

    cli.py         the `splitspec` command and its subcommands (`python -m splitspec.launcher`)
    serve.py       `splitspec serve`: vLLM's flags, each turned into `up`'s or a service's flag
    speculative_config.py  vLLM's --speculative-config JSON read into the services' flags
    up.py          `splitspec up`: its flags, the stack they describe, start and supervise
    config.py      StackConfig: which services run, on which ports, with which flags
    ports.py       default ports that never collide; a port given to two services refused
    service.py     one service process, and its gRPC health check
    threads.py     each process's default torch threads from the host's cores
    stack.py       Stack: the processes, started in dependency tiers and stopped together
    supervisor.py  restarts a service that exits, with backoff

An app on top of the services, not part of what they share: it starts them by module path and
imports none of them, and nothing else in splitspec/ imports it (tests/test_import_graph.py).
Tests, benchmarks and scripts take what they need from here.
"""

from splitspec.launcher.cli import main
from splitspec.launcher.config import ProposerLaunch, StackConfig, sibling_proposer_models
from splitspec.launcher.service import Service, grpc_healthy
from splitspec.launcher.stack import REPO_ROOT, Stack

__all__ = ["REPO_ROOT", "ProposerLaunch", "Service", "Stack", "StackConfig", "grpc_healthy",
           "main", "sibling_proposer_models"]
