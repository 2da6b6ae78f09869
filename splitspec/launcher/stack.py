"""A local stack: the proposer, verifier and gateway processes of a `StackConfig`, started in
dependency tiers (the proposers together, then the verifier replicas together once every
proposer serves, then the gateway once every verifier serves) and stopped together. The services
are started by module path (`python -m gateway.server`, ...); nothing here imports them."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from splitspec.launcher.config import StackConfig
from splitspec.launcher.ports import check_distinct
from splitspec.launcher.service import Service, grpc_healthy
from splitspec.launcher.supervisor import Supervisor
from splitspec.launcher.threads import (
    DRAFTER,
    LIGHT,
    THREADS_ENV,
    VERIFIER,
    host_cores,
    plan_threads,
)
from splitspec.lifecycle import LAUNCHER_PID_ENV
from splitspec.methods import METHODS, HiddenState
from splitspec.net import wait_for_port
from splitspec.telemetry.config import stack_metrics_ports

if TYPE_CHECKING:  # cryptography is imported only where certificates are made
    from splitspec.tls_certs import StackCertificates

REPO_ROOT = Path(__file__).resolve().parents[2]


class Stack:
    """Proposer + verifier + gateway processes; usable as a context manager."""

    def __init__(self, config: StackConfig):
        c = self.config = config
        py = sys.executable
        log = (lambda n: c.log_dir / f"{n}.log") if c.log_dir else (lambda n: None)
        base = [py, "-m", "proposer_service.server", "--host", c.host]
        self.proposers: dict[str, Service] = {}
        for method, launch in c.launched().items():
            argv = [*base, "--method", method, "--port", str(launch.port)]
            if launch.model:
                argv += ["--model", launch.model, "--device", c.device]
            if METHODS[method].capabilities.hidden_state is not HiddenState.NONE:
                # it conditions on the target's hidden states: the target's tokenizer is its
                argv += ["--tokenizer", c.model]
            self.proposers[method] = Service(f"proposer-{method}", [*argv, *launch.args],
                                             launch.port, log(f"proposer-{method}"))
        self.verifiers: list[Service] = []
        for i, port in enumerate(c.replica_ports()):
            name = "verifier" if i == 0 else f"verifier-{i + 1}"
            self.verifiers.append(Service(name, [
                py, "-m", "verifier_service.server", "--model", c.model, "--host", c.host,
                "--port", str(port), "--device", c.device,
                *(a for m, svc in self.proposers.items()
                  for a in ("--proposer", f"{m}={c.host}:{svc.port}")),
                *(a for m, d in c.in_target_models.items() for a in (f"--{m}", d)),
                *(["--tensor-parallel-size", str(c.tensor_parallel_size)]
                  if c.tensor_parallel_size > 1 else []),
                *c.verifier_args], port, log(name)))
        self.verifier = self.verifiers[0]
        self.gateway = Service("gateway", [
            py, "-m", "gateway.server", "--host", c.host, "--http-port", str(c.http_port),
            "--grpc-port", str(c.grpc_port),
            *(a for v in self.verifiers for a in ("--verifier", f"{c.host}:{v.port}")),
            *c.gateway_args], c.grpc_port, log("gateway"))
        self.services = [*self.proposers.values(), *self.verifiers, self.gateway]
        # metrics ports in this order (consecutive from --metrics-port): gateway, verifier,
        # proposers, further verifier replicas
        self.metrics_ports = stack_metrics_ports(
            [s.name for s in (self.gateway, self.verifier, *self.proposers.values(),
                              *self.verifiers[1:])], c.metrics_port)
        check_distinct([("the gateway's REST port", c.http_port),
                        *((svc.name, svc.port) for svc in self.services),
                        *((f"the metrics of {name}", port)
                          for name, port in self.metrics_ports.items())])
        for svc in self.services:
            svc.argv += ["--metrics-port", str(self.metrics_ports[svc.name])]
        self.threads = self.thread_plan()
        for svc in self.services:
            if svc.name in self.threads:
                svc.env[THREADS_ENV] = str(self.threads[svc.name])
        if c.tls is not None:
            self._add_tls_flags(c.tls)

    def thread_plan(self) -> dict[str, int]:
        """Each service's default torch threads (its OMP_NUM_THREADS; its own --threads wins);
        none when the launcher's environment sets OMP_NUM_THREADS: every service keeps that."""
        if THREADS_ENV in os.environ:
            return {}
        roles = {svc.name: (DRAFTER if METHODS[m].capabilities.needs_model else LIGHT)
                 for m, svc in self.proposers.items()}
        roles.update({svc.name: VERIFIER for svc in self.verifiers})
        roles[self.gateway.name] = LIGHT
        return plan_threads(self.config.cores or host_cores(), roles,
                            ranks_per_verifier=self.config.tensor_parallel_size)

    def _add_tls_flags(self, certs: StackCertificates) -> None:
        """Mutual TLS on every hop: each service its role's certificate and the CA; verifiers
        serve only the gateway, proposers only verifiers (flags passed by hand come after these:
        a file given again wins, a --tls-allow-peer adds an identity)."""
        from splitspec.tls_certs import role_identity

        def flags(role: str, caller: str | None) -> list[str]:
            return ["--tls-cert", str(certs[role].cert), "--tls-key", str(certs[role].key),
                    "--tls-ca", str(certs.ca),
                    *(["--tls-allow-peer", role_identity(caller)] if caller else [])]

        for svc in self.proposers.values():
            svc.argv[3:3] = flags("proposer", "verifier")
        for svc in self.verifiers:
            svc.argv[3:3] = flags("verifier", "gateway")
        self.gateway.argv[3:3] = flags("gateway", None)

    @property
    def health_credentials(self) -> grpc.ChannelCredentials | None:
        """What the health checks present (TLS: the client role's certificate)."""
        tls = self.config.tls
        if tls is None:
            return None
        return grpc.ssl_channel_credentials(tls.ca.read_bytes(), tls["client"].key.read_bytes(),
                                            tls["client"].cert.read_bytes())

    @property
    def metrics_urls(self) -> dict[str, str]:
        """Service name -> its /metrics URL (none when metrics are off)."""
        return {name: f"http://{self.config.host}:{port}/metrics"
                for name, port in self.metrics_ports.items() if port}

    @property
    def url(self) -> str:
        scheme = "https" if self.config.tls is not None else "http"
        return f"{scheme}://{self.config.host}:{self.config.http_port}"

    @staticmethod
    def environment() -> dict[str, str]:
        """The children's environment: offline model loading, this checkout importable."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
        env[LAUNCHER_PID_ENV] = str(os.getpid())  # services exit with their launcher
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                          env.get("PYTHONPATH")]))
        return env

    def start(self) -> None:
        if self.config.log_dir:
            self.config.log_dir.mkdir(parents=True, exist_ok=True)
        env = self.environment()
        deadline = time.monotonic() + self.config.startup_timeout_s
        try:
            for tier in self.tiers():  # a tier starts together once the one before serves
                for svc in tier:
                    svc.start(env)
                for svc in tier:
                    self._wait_healthy(svc, deadline)
            if not wait_for_port(self.config.host, self.config.http_port,
                                 max(1.0, deadline - time.monotonic())):
                raise RuntimeError("gateway REST port did not open")
        except BaseException:
            self.stop()
            raise

    def tiers(self) -> list[list[Service]]:
        """The services in start-up order, grouped: members of a group depend on nothing in it
        (a verifier dials its proposers, the gateway its verifiers), so they start together:
        a process spends its first seconds importing and loading, which overlap."""
        return [t for t in (list(self.proposers.values()), self.verifiers, [self.gateway]) if t]

    def supervisor(self) -> Supervisor:
        """Restarts any of this stack's services that exits (call its poll())."""
        return Supervisor(self.services, self.environment)

    def restart(self, svc: Service) -> None:
        """Start one (stopped or killed) service again on its port and wait until it is healthy."""
        svc.stop()
        svc.start(self.environment())
        self._wait_healthy(svc, time.monotonic() + self.config.startup_timeout_s)

    def _wait_healthy(self, svc: Service, deadline: float) -> None:
        while time.monotonic() < deadline:
            if not svc.alive():
                raise RuntimeError(f"{svc.name} exited with code {svc.proc.returncode}"
                                   + (f"; see {svc.log_path}" if svc.log_path else ""))
            if grpc_healthy(svc.port, self.config.host, credentials=self.health_credentials):
                return
            time.sleep(0.2)
        raise RuntimeError(f"{svc.name} did not become healthy in time")

    def stop(self) -> None:
        for svc in reversed(self.services):
            svc.stop()

    def __enter__(self) -> "Stack":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
