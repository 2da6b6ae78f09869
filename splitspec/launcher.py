"""Start the whole stack locally: proposer(s), verifier and gateway as separate processes.

    splitspec up [--model DIR] [--http-port 8000] [--no-draft] [--no-mlp] ...

The n-gram proposer always runs. A draft-model proposer and an MLP speculator proposer run too
when their models are given (--draft-model, --mlp-model) or, by default, when `draft/` and
`mlp-speculator/` sit next to the target model directory and fit it (same tokenizer file; a
speculator with the target's hidden and vocabulary sizes). Each is its own process, added to the
verifier's --proposer list.

Prints the gateway URL once every service reports healthy; SIGINT or SIGTERM stops all of them
(children are in their own process group, so nothing is left behind). The integration tests use
the same `Stack` class with free ports.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitspec.lifecycle import LAUNCHER_PID_ENV
from splitspec.net import free_port, wait_for_port
from verifier_service.config import DEFAULT_MODEL

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
        with grpc.insecure_channel(f"{host}:{port}") as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                        timeout=timeout)
            return resp.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def sibling_proposer_models(model: str | Path) -> tuple[str | None, str | None]:
    """(draft dir, speculator dir) found next to the target directory, each only when it fits the
    target: a draft with a byte-identical tokenizer.json, a speculator whose config has the
    target's hidden and vocabulary sizes. Cheap file checks; the verifier still checks Info."""
    target = Path(model)
    draft, spec = target.parent / "draft", target.parent / "mlp-speculator"
    tok = target / "tokenizer.json"
    found_draft = found_spec = None
    if (draft / "config.json").is_file() and tok.is_file() and \
            (draft / "tokenizer.json").is_file() and \
            (draft / "tokenizer.json").read_bytes() == tok.read_bytes():
        found_draft = str(draft)
    try:
        tcfg = json.loads((target / "config.json").read_text())
        scfg = json.loads((spec / "config.json").read_text())
        if (scfg.get("emb_dim"), scfg.get("vocab_size")) == (tcfg.get("hidden_size"),
                                                              tcfg.get("vocab_size")):
            found_spec = str(spec)
    except (OSError, ValueError):
        pass
    return found_draft, found_spec


@dataclass
class StackConfig:
    model: str = DEFAULT_MODEL
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 50050
    verifier_port: int = 50051
    ngram_port: int = 50052
    device: str = "auto"
    log_dir: Path | None = None
    verifier_args: list[str] = field(default_factory=list)
    startup_timeout_s: float = 180.0
    # Learned proposers: None leaves them out. Each gets --device `device` and --dtype auto
    # unless its extra args say otherwise (the last flag wins).
    draft_model: str | None = None
    draft_port: int = 50053
    draft_args: list[str] = field(default_factory=list)
    mlp_model: str | None = None
    mlp_port: int = 50054
    mlp_args: list[str] = field(default_factory=list)

    @classmethod
    def with_free_ports(cls, **kwargs) -> "StackConfig":
        return cls(http_port=free_port(), grpc_port=free_port(), verifier_port=free_port(),
                   ngram_port=free_port(), draft_port=free_port(), mlp_port=free_port(), **kwargs)


class Stack:
    """Proposer + verifier + gateway processes; usable as a context manager."""

    def __init__(self, config: StackConfig):
        c = self.config = config
        py = sys.executable
        log = (lambda n: c.log_dir / f"{n}.log") if c.log_dir else (lambda n: None)
        proposer = [py, "-m", "proposer_service.server", "--host", c.host]
        self.proposer = Service("proposer-ngram", [
            *proposer, "--method", "ngram", "--port", str(c.ngram_port)],
            c.ngram_port, log("proposer-ngram"))
        self.draft = None if c.draft_model is None else Service("proposer-draft", [
            *proposer, "--method", "draft", "--port", str(c.draft_port), "--model",
            c.draft_model, "--device", c.device, *c.draft_args], c.draft_port,
            log("proposer-draft"))
        # The speculator conditions on the target's hidden states: the target's tokenizer is its.
        self.mlp = None if c.mlp_model is None else Service("proposer-mlp", [
            *proposer, "--method", "mlp", "--port", str(c.mlp_port), "--model", c.mlp_model,
            "--tokenizer", c.model, "--device", c.device, *c.mlp_args], c.mlp_port,
            log("proposer-mlp"))
        self.proposers = {"ngram": self.proposer}
        if self.draft is not None:
            self.proposers["draft"] = self.draft
        if self.mlp is not None:
            self.proposers["mlp"] = self.mlp
        self.verifier = Service("verifier", [
            py, "-m", "verifier_service.server", "--model", c.model, "--host", c.host,
            "--port", str(c.verifier_port), "--device", c.device,
            *(a for m, svc in self.proposers.items()
              for a in ("--proposer", f"{m}={c.host}:{svc.port}")),
            *c.verifier_args], c.verifier_port, log("verifier"))
        self.gateway = Service("gateway", [
            py, "-m", "gateway.server", "--host", c.host, "--http-port", str(c.http_port),
            "--grpc-port", str(c.grpc_port), "--verifier", f"{c.host}:{c.verifier_port}"],
            c.grpc_port, log("gateway"))
        self.services = [*self.proposers.values(), self.verifier, self.gateway]

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
    up.add_argument("--draft-model", default=None,
                    help="draft model directory (default: draft/ next to the target, if it fits)")
    up.add_argument("--mlp-model", default=None, help="MLP speculator directory "
                    "(default: mlp-speculator/ next to the target, if it fits)")
    up.add_argument("--draft", action=argparse.BooleanOptionalAction, default=True,
                    help="run the draft-model proposer when a draft model is found")
    up.add_argument("--mlp", action=argparse.BooleanOptionalAction, default=True,
                    help="run the MLP speculator proposer when a speculator is found")
    up.add_argument("--draft-port", type=int, default=d.draft_port)
    up.add_argument("--mlp-port", type=int, default=d.mlp_port)
    up.add_argument("--draft-device", default=None, help="device of the draft proposer "
                    "(default: --device)")
    up.add_argument("--mlp-device", default=None, help="device of the MLP proposer "
                    "(default: --device)")
    up.add_argument("--host", default=d.host)
    up.add_argument("--http-port", type=int, default=d.http_port)
    up.add_argument("--grpc-port", type=int, default=d.grpc_port)
    up.add_argument("--verifier-port", type=int, default=d.verifier_port)
    up.add_argument("--ngram-port", type=int, default=d.ngram_port)
    up.add_argument("--device", default=d.device)
    up.add_argument("--log-dir", type=Path, default=None,
                    help="write each service's log here (default: this terminal)")
    args = ap.parse_args(argv)
    found_draft, found_mlp = sibling_proposer_models(args.model)
    draft_model = (args.draft_model or found_draft) if args.draft else None
    mlp_model = (args.mlp_model or found_mlp) if args.mlp else None
    stack = Stack(StackConfig(
        model=args.model, host=args.host, http_port=args.http_port, grpc_port=args.grpc_port,
        verifier_port=args.verifier_port, ngram_port=args.ngram_port, device=args.device,
        log_dir=args.log_dir, draft_model=draft_model, draft_port=args.draft_port,
        draft_args=["--device", args.draft_device] if args.draft_device else [],
        mlp_model=mlp_model, mlp_port=args.mlp_port,
        mlp_args=["--device", args.mlp_device] if args.mlp_device else []))
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
    print(f"splitspec is serving {args.model} (proposers: {', '.join(stack.proposers)})\n"
          f"  REST (OpenAI-compatible): {stack.url}\n"
          f"  gRPC (splitspec.v1.Generation): {args.host}:{args.grpc_port}\n"
          f"Ctrl-C stops everything.", flush=True)
    try:
        while not stopping:
            for svc in stack.services:
                if not svc.alive():
                    print(f"splitspec: {svc.name} exited; stopping", file=sys.stderr)
                    stopping = True
            time.sleep(0.2)
    finally:
        stack.stop()
        print("splitspec: stopped", flush=True)


if __name__ == "__main__":
    main()
