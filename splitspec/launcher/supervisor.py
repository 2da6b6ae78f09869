"""Keep a local stack's services running: a service that exits is started again on its ports
after a backoff (0.5 s, doubling up to 10 s; back to 0.5 s once it has stayed up 30 s), and
the others keep serving meanwhile. Call poll() from the thread that started the stack, and
keep that thread alive: a service follows the thread that started it (PR_SET_PDEATHSIG is per
thread, splitspec/lifecycle.py), so services restarted from a thread that then ends would
be stopped with it. What a death costs, by service:

- a proposer: speculation only; its requests decode plainly and report
  `reason: proposer_unavailable` in their usage until it is back (the verifier reconnects);
- one of several verifier replicas: nothing a client sees; the gateway stops routing to it
  (it watches its health) and resumes its streams on another replica (docs/reliability.md);
- the only verifier: new requests get 503 until it is back; with the gateway's
  `--resume-wait-s`, streams in flight wait for it and resume there;
- the gateway: its clients' connections; it is back within a second or two.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from splitspec.launcher.service import Service

INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
STABLE_AFTER_S = 30.0  # up this long: the next death starts from the initial backoff again


@dataclass
class _Watch:
    backoff_s: float = INITIAL_BACKOFF_S
    started_at: float = field(default_factory=time.monotonic)
    restart_at: float | None = None  # set while it waits to be started again
    restarts: int = 0


class Supervisor:
    def __init__(self, services: Sequence[Service], environment: Callable[[], dict[str, str]],
                 log: Callable[[str], None] | None = None):
        self.services = list(services)
        self._environment = environment
        self._log = log or (lambda line: print(f"splitspec: {line}", file=sys.stderr,
                                               flush=True))
        self._watch = {svc.name: _Watch() for svc in self.services}

    def restarts(self, name: str) -> int:
        return self._watch[name].restarts

    def poll(self, now: float | None = None) -> None:
        """Notice exited services and start the ones whose backoff is over; never blocks."""
        now = time.monotonic() if now is None else now
        for svc in self.services:
            w = self._watch[svc.name]
            if svc.alive():
                if now - w.started_at >= STABLE_AFTER_S:
                    w.backoff_s = INITIAL_BACKOFF_S
                continue
            if w.restart_at is None:
                code = svc.proc.returncode if svc.proc is not None else None
                w.restart_at = now + w.backoff_s
                self._log(f"{svc.name} exited with code {code}; restarting in "
                          f"{w.backoff_s:.1f} s" + (f" (log: {svc.log_path})"
                                                    if svc.log_path else ""))
            elif now >= w.restart_at:
                svc.start(self._environment())
                w.restart_at, w.started_at = None, now
                w.backoff_s = min(MAX_BACKOFF_S, w.backoff_s * 2)
                w.restarts += 1
