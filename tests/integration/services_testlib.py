"""Extra service processes next to a test stack: a second replica of one of its services on
other ports, started and awaited like the stack's own."""

from __future__ import annotations

from polling import wait_until

from splitspec.launcher import Service, Stack, grpc_healthy


def on_port(argv: list[str], port: int, flag: str = "--port", *more: str) -> list[str]:
    """A copy of a service's command line serving on another port (`more`: further flag/value
    pairs to replace), with no metrics endpoint of its own."""
    argv = list(argv)
    for name, value in ((flag, str(port)), *zip(more[::2], more[1::2]),
                        *((("--metrics-port", "0"),) if "--metrics-port" in argv else ())):
        argv[argv.index(name) + 1] = value
    return argv


def start_healthy(svc: Service, timeout: float) -> None:
    svc.start(Stack.environment())

    def healthy() -> bool:
        assert svc.alive(), f"{svc.name} exited; see {svc.log_path}"
        return grpc_healthy(svc.port)

    wait_until(healthy, timeout, 0.1, f"{svc.name} to become healthy")
