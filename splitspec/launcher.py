"""Start the whole stack locally: proposer(s), verifier and gateway as separate processes.

    splitspec up [--model DIR] [--http-port 8000] [--no-draft] [--no-mlp]
                 [--verifier-replicas N] [--verifier-args '--max-waiting 64'] ...

One proposer process per method of the registry (splitspec/methods.py), each added to the
verifier's --proposer list. Methods without a model (n-gram) always run; a model-backed method
runs when its model is given (--draft-model, --mlp-model, ...) or, by default, when its directory
(`draft/`, `mlp-speculator/`) sits next to the target and fits it (same tokenizer file; a
speculator with the target's hidden and vocabulary sizes). --no-METHOD leaves one out.

--verifier-replicas N starts N verifiers (ports from --verifier-port up), all sharing the
proposers, behind the one gateway. Any service flag passes through: --gateway-args,
--verifier-args, --proposer-args (every proposer) and --METHOD-args take a quoted flag list.

Prints the gateway URL once every service reports healthy, then supervises them: a service that
exits is started again with backoff while the others keep serving (splitspec/supervisor.py).
SIGINT or SIGTERM stops all of them (children are in their own process group, so nothing is
left behind). The integration tests use the same `Stack` class with free ports.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitspec.config import DEFAULT_MODEL
from splitspec.grpc_server import CHANNEL_OPTIONS
from splitspec.lifecycle import LAUNCHER_PID_ENV
from splitspec.methods import METHODS, HiddenState, find_model, proposer_methods
from splitspec.net import free_port, wait_for_port
from splitspec.supervisor import Supervisor
from splitspec.telemetry.config import GATEWAY_METRICS_PORT, stack_metrics_ports

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Service:
    name: str
    argv: list[str]
    port: int  # the gRPC port probed for health
    log_path: Path | None = None
    proc: subprocess.Popen | None = None

    def start(self, env: dict[str, str]) -> None:
        out = open(self.log_path, "ab") if self.log_path else None
        self.proc = subprocess.Popen(self.argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        if out:
            out.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def grpc_healthy(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    try:
        with grpc.insecure_channel(f"{host}:{port}", options=CHANNEL_OPTIONS) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                        timeout=timeout)
            return resp.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def sibling_proposer_models(model: str | Path) -> dict[str, str]:
    """Per model-backed method, its model directory found next to the target, when it fits
    (cheap file checks; the verifier still checks Info)."""
    found = {name: find_model(spec, model) for name, spec in METHODS.items()}
    return {name: path for name, path in found.items() if path}


@dataclass
class ProposerLaunch:
    """How one proposer method is started."""

    port: int
    model: str | None = None  # model-backed methods: None leaves the method out
    args: list[str] = field(default_factory=list)  # extra flags; the last one given wins


@dataclass
class StackConfig:
    model: str = DEFAULT_MODEL
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 50050
    verifier_port: int = 50051
    device: str = "auto"
    log_dir: Path | None = None
    verifier_args: list[str] = field(default_factory=list)
    gateway_args: list[str] = field(default_factory=list)
    # Verifiers sharing the proposers behind the gateway; ports: verifier_port, then
    # verifier_ports[1:] when given, else consecutive.
    verifier_replicas: int = 1
    verifier_ports: list[int] = field(default_factory=list)
    startup_timeout_s: float = 180.0
    # Per method; each gets --device `device` and --dtype auto unless its args say otherwise.
    # Methods missing here are not started; model-backed ones also need a model.
    proposers: dict[str, ProposerLaunch] = field(default_factory=lambda: {
        name: ProposerLaunch(spec.default_port) for name, spec in proposer_methods().items()})
    # Prometheus /metrics: the gateway on this port, the verifier on the next, then the
    # proposers; None: each on a free port; 0: off.
    metrics_port: int | None = GATEWAY_METRICS_PORT

    @classmethod
    def with_free_ports(cls, models: dict[str, str] | None = None,
                        proposer_args: dict[str, list[str]] | None = None,
                        methods: Sequence[str] | None = None, **kwargs) -> "StackConfig":
        """Every port free; `models` gives model-backed methods their directories."""
        models, proposer_args = models or {}, proposer_args or {}
        names = list(proposer_methods()) if methods is None else list(methods)
        kwargs.setdefault("metrics_port", None)
        verifier_ports = [free_port() for _ in range(kwargs.get("verifier_replicas", 1))]
        return cls(http_port=free_port(), grpc_port=free_port(), verifier_port=verifier_ports[0],
                   verifier_ports=verifier_ports,
                   proposers={m: ProposerLaunch(free_port(), models.get(m),
                                                list(proposer_args.get(m, [])))
                              for m in names}, **kwargs)

    def replica_ports(self) -> list[int]:
        """The gRPC port of each verifier replica."""
        given = self.verifier_ports[1:self.verifier_replicas]
        return [self.verifier_port, *given,
                *(self.verifier_port + i for i in range(1 + len(given), self.verifier_replicas))]

    def launched(self) -> dict[str, ProposerLaunch]:
        """The methods that will actually start."""
        return {m: p for m, p in self.proposers.items()
                if not METHODS[m].capabilities.needs_model or p.model}


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
                *c.verifier_args], port, log(name)))
        self.verifier = self.verifiers[0]
        self.gateway = Service("gateway", [
            py, "-m", "gateway.server", "--host", c.host, "--http-port", str(c.http_port),
            "--grpc-port", str(c.grpc_port),
            *(a for v in self.verifiers for a in ("--verifier", f"{c.host}:{v.port}")),
            *c.gateway_args], c.grpc_port, log("gateway"))
        self.services = [*self.proposers.values(), *self.verifiers, self.gateway]
        ports = [c.http_port, *(svc.port for svc in self.services)]
        if clash := sorted({p for p in ports if ports.count(p) > 1}):
            raise ValueError(f"port {clash[0]} is given to two services (verifier replicas take "
                             "consecutive ports from --verifier-port)")
        # metrics ports in this order (consecutive from --metrics-port): gateway, verifier,
        # proposers, further verifier replicas
        self.metrics_ports = stack_metrics_ports(
            [s.name for s in (self.gateway, self.verifier, *self.proposers.values(),
                              *self.verifiers[1:])], c.metrics_port)
        for svc in self.services:
            svc.argv += ["--metrics-port", str(self.metrics_ports[svc.name])]

    @property
    def metrics_urls(self) -> dict[str, str]:
        """Service name -> its /metrics URL (none when metrics are off)."""
        return {name: f"http://{self.config.host}:{port}/metrics"
                for name, port in self.metrics_ports.items() if port}

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.http_port}"

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
            for svc in self.services:  # in dependency order: each waits for the one before
                svc.start(env)
                self._wait_healthy(svc, deadline)
            if not wait_for_port(self.config.host, self.config.http_port,
                                 max(1.0, deadline - time.monotonic())):
                raise RuntimeError("gateway REST port did not open")
        except BaseException:
            self.stop()
            raise

    def supervisor(self) -> Supervisor:
        """Restarts any of this stack's services that exits (call its poll() or run())."""
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
            if grpc_healthy(svc.port, self.config.host):
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


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="splitspec", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="serve gateway + verifier + proposers locally")
    d = StackConfig()
    up.add_argument("--model", default=d.model, help="target model directory")
    up.add_argument("--host", default=d.host)
    up.add_argument("--http-port", type=int, default=d.http_port)
    up.add_argument("--grpc-port", type=int, default=d.grpc_port)
    up.add_argument("--verifier-port", type=int, default=d.verifier_port,
                    help="the first verifier's port; further replicas take the next ones")
    up.add_argument("--verifier-replicas", type=int, default=d.verifier_replicas,
                    help="verifiers behind the gateway, sharing the proposers")
    flags = "a quoted list of flags, e.g. '--max-waiting 64 --max-num-seqs 16'"
    up.add_argument("--gateway-args", default="", help=f"passed to the gateway: {flags}")
    up.add_argument("--verifier-args", default="", help=f"passed to every verifier: {flags}")
    up.add_argument("--proposer-args", default="", help=f"passed to every proposer: {flags}")
    up.add_argument("--resume-wait-s", type=float, default=30.0,
                    help="how long the gateway lets a stream whose verifier died wait for one "
                    "to serve again (the supervisor restarts it)")
    up.add_argument("--device", default=d.device)
    up.add_argument("--log-dir", type=Path, default=None,
                    help="write each service's log here (default: this terminal)")
    up.add_argument("--metrics-port", type=int, default=d.metrics_port,
                    help="Prometheus /metrics of the gateway; the verifier and proposers get the "
                    "next ports (0: off)")
    for name, spec in proposer_methods().items():  # per proposer: on/off, port, model, device
        up.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=True,
                        help=f"run the {name} proposer ({spec.summary})"
                        + (" when its model is found" if spec.capabilities.needs_model else ""))
        up.add_argument(f"--{name}-port", type=int, default=spec.default_port)
        up.add_argument(f"--{name}-args", default="",
                        help=f"passed to the {name} proposer (after --proposer-args)")
        if spec.capabilities.needs_model:
            up.add_argument(f"--{name}-model", default=None,
                            help=f"its model directory (default: {spec.model_dir}/ next to the "
                            "target, if it fits)")
            up.add_argument(f"--{name}-device", default=None,
                            help="its device (default: --device)")
    args = ap.parse_args(argv)
    if args.verifier_replicas < 1:
        ap.error("--verifier-replicas must be at least 1")
    found = sibling_proposer_models(args.model)
    launches = {}
    for name, spec in proposer_methods().items():
        opt = name.replace("-", "_")
        if not getattr(args, opt):
            continue
        model = (getattr(args, f"{opt}_model") or found.get(name)
                 if spec.capabilities.needs_model else None)
        device = getattr(args, f"{opt}_device", None)
        launches[name] = ProposerLaunch(getattr(args, f"{opt}_port"), model,
                                        [*(["--device", device] if device else []),
                                         *shlex.split(args.proposer_args),
                                         *shlex.split(getattr(args, f"{opt}_args"))])
    try:
        stack = Stack(StackConfig(
            model=args.model, host=args.host, http_port=args.http_port,
            grpc_port=args.grpc_port, verifier_port=args.verifier_port, device=args.device,
            log_dir=args.log_dir, proposers=launches, metrics_port=args.metrics_port,
            verifier_replicas=args.verifier_replicas,
            verifier_args=shlex.split(args.verifier_args),
            gateway_args=["--resume-wait-s", str(args.resume_wait_s),
                          *shlex.split(args.gateway_args)]))
    except ValueError as exc:
        ap.error(str(exc))
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.start()
    except RuntimeError as exc:
        print(f"splitspec: {exc}", file=sys.stderr)
        sys.exit(1)
    print(f"splitspec is serving {args.model} (proposers: {', '.join(stack.proposers)}; "
          f"verifier replicas: {len(stack.verifiers)})\n"
          f"  REST (OpenAI-compatible): {stack.url}\n"
          f"  gRPC (splitspec.v1.Generation): {args.host}:{args.grpc_port}\n"
          + "".join(f"  metrics of {name}: {url}\n" for name, url in stack.metrics_urls.items())
          + "Ctrl-C stops everything.", flush=True)
    supervisor = stack.supervisor()
    try:
        while not stopping:
            supervisor.poll()
            time.sleep(0.2)
    finally:
        stack.stop()
        print("splitspec: stopped", flush=True)


if __name__ == "__main__":
    main()
