"""Services started by the launcher end with it, even when it is killed with SIGKILL.

The launcher puts its pid in the children's environment; each service, first thing in main(),
asks Linux for SIGTERM when its parent dies (PR_SET_PDEATHSIG) and exits at once if the launcher
is already gone. This runs in the service itself after exec: code between fork and exec (a
preexec_fn) is unsafe when the launching process has threads, as test processes do.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

LAUNCHER_PID_ENV = "SPLITSPEC_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


def exit_with_launcher() -> None:
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher or not sys.platform.startswith("linux"):
        return  # started by hand or by an orchestrator: nothing to follow
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(launcher):  # it died before the request took effect
        sys.exit(1)
