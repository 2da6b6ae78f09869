"""What a local stack runs: which proposer methods (and their models), how many verifier
replicas, every port (splitspec/launcher/ports.py), TLS or not, and the flags passed through."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from splitspec.config import DEFAULT_MODEL
from splitspec.launcher.ports import replica_ports
from splitspec.methods import METHODS, find_model, proposer_methods
from splitspec.net import free_port
from splitspec.telemetry.config import GATEWAY_METRICS_PORT

if TYPE_CHECKING:  # cryptography is imported only where certificates are made
    from splitspec.tls_certs import StackCertificates


def sibling_proposer_models(model: str | Path) -> dict[str, str]:
    """Per model-backed method (proposers and in-target ones, e.g. an EAGLE head), its model
    directory found next to the target, when it fits (cheap file checks; the verifier still
    checks Info, and loads an in-target method's model itself)."""
    found = {name: find_model(spec, model) for name, spec in METHODS.items()
             if spec.capabilities.needs_model}
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
    # verifier_ports[1:] when given, else the next ports no other service has.
    verifier_replicas: int = 1
    verifier_ports: list[int] = field(default_factory=list)
    # Each verifier splits its target over this many devices (--tensor-parallel-size).
    tensor_parallel_size: int = 1
    startup_timeout_s: float = 180.0
    # Per method; each gets --device `device` and --dtype auto unless its args say otherwise.
    # Methods missing here are not started; model-backed ones also need a model.
    proposers: dict[str, ProposerLaunch] = field(default_factory=lambda: {
        name: ProposerLaunch(spec.default_port) for name, spec in proposer_methods().items()})
    # Prometheus /metrics: the gateway on this port, the verifier on the next, then the
    # proposers; None: each on a free port; 0: off.
    metrics_port: int | None = GATEWAY_METRICS_PORT
    # Mutual TLS on every hop with these certificates (splitspec/tls_certs.py): each service
    # presents its role's, checks its peers against the CA and serves only the role that calls
    # it; the gateway's front doors serve HTTPS / TLS with its certificate. None: plaintext.
    tls: StackCertificates | None = None
    # In-target methods backed by a model (an EAGLE head): method -> its directory, passed to
    # every verifier as --METHOD DIR. Missing: the verifiers do not serve the method.
    in_target_models: dict[str, str] = field(default_factory=dict)
    # The cores the services share, for their default threads (splitspec/launcher/threads.py);
    # None: the cores this process may run on.
    cores: int | None = None

    @classmethod
    def with_free_ports(cls, models: dict[str, str] | None = None,
                        proposer_args: dict[str, list[str]] | None = None,
                        methods: Sequence[str] | None = None, **kwargs) -> "StackConfig":
        """Every port free; `models` gives model-backed methods their directories. `methods`
        (default: every proposer method) may name in-target methods too: every verifier serves
        those itself, so they start no process."""
        models, proposer_args = models or {}, proposer_args or {}
        unknown = [m for m in methods or () if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}; known: {sorted(METHODS)}")
        names = [m for m in (methods if methods is not None else METHODS)
                 if m in proposer_methods()]
        kwargs.setdefault("metrics_port", None)
        kwargs.setdefault("in_target_models", {
            m: d for m, d in models.items() if m in METHODS and m not in proposer_methods()
            and (methods is None or m in methods)})
        verifier_ports = [free_port() for _ in range(kwargs.get("verifier_replicas", 1))]
        return cls(http_port=free_port(), grpc_port=free_port(), verifier_port=verifier_ports[0],
                   verifier_ports=verifier_ports,
                   proposers={m: ProposerLaunch(free_port(), models.get(m),
                                                list(proposer_args.get(m, [])))
                              for m in names}, **kwargs)

    def replica_ports(self) -> list[int]:
        """The gRPC port of each verifier replica (none on a port of another service)."""
        taken = {self.http_port, self.grpc_port, *(p.port for p in self.proposers.values())}
        return replica_ports(self.verifier_port, self.verifier_replicas,
                             self.verifier_ports[1:], taken)

    def launched(self) -> dict[str, ProposerLaunch]:
        """The methods that will actually start."""
        return {m: p for m, p in self.proposers.items()
                if not METHODS[m].capabilities.needs_model or p.model}
