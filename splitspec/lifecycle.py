"""A service process's life: its main() (`run_service`), its stop signals (`until_stopped`), and
ending with the launcher that started it, even when that is killed with SIGKILL.

The launcher puts its pid in the children's environment; each service, first thing in main(),
asks Linux for SIGTERM when its parent dies (PR_SET_PDEATHSIG) and exits at once if the launcher
is already gone. This runs in the service itself after exec: code between fork and exec (a
preexec_fn) is unsafe when the launching process has threads, as test processes do.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from typing import Awaitable, Callable, Sequence, TypeVar

T = TypeVar("T")

LAUNCHER_PID_ENV = "SPLITSPEC_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


def exit_with_launcher() -> None:
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher or not sys.platform.startswith("linux"):
        return  # started by hand or by an orchestrator: nothing to follow
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(launcher):  # it died before the request took effect
        sys.exit(1)


def run_service(config_cls: type[T], argv: Sequence[str] | None, metrics_port: int,
                serve: Callable[[T, object], Awaitable[None]],
                otel_service_name: Callable[[T], str]) -> None:
    """A service's main(): follow the launcher, parse flags (the service's and telemetry's),
    set up logging and tracing, run `serve(config, telemetry_config)` until it returns."""
    from splitspec.errors import StartupError
    from splitspec.grpc_server import setup_logging
    from splitspec.telemetry.config import parse_service_config
    from splitspec.telemetry.tracing import setup_tracing, shutdown_tracing

    exit_with_launcher()
    config, telemetry_config = parse_service_config(config_cls, argv, metrics_port)
    setup_logging(config.log_level)
    setup_tracing(otel_service_name(config))
    try:
        asyncio.run(serve(config, telemetry_config))
    except StartupError as exc:  # one line naming what is wrong, no traceback
        print(f"{otel_service_name(config)}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    finally:
        shutdown_tracing()


async def until_stopped() -> None:
    """Return on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
