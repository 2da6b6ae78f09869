"""One service of a local stack: its process (in a session of its own, so that stopping it
stops everything it started) and the gRPC health check that says it serves."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitspec.grpc_server import CHANNEL_OPTIONS


@dataclass
class Service:
    name: str
    argv: list[str]
    port: int  # the gRPC port probed for health
    log_path: Path | None = None
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)  # this service's own, over the stack's

    def start(self, env: dict[str, str]) -> None:
        out = open(self.log_path, "ab") if self.log_path else None
        self.proc = subprocess.Popen(self.argv, env={**env, **self.env}, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
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


def grpc_healthy(port: int, host: str = "127.0.0.1", timeout: float = 1.0,
                 credentials: grpc.ChannelCredentials | None = None) -> bool:
    """Whether the service on host:port answers SERVING (over TLS with `credentials`)."""
    address = f"{host}:{port}"
    try:
        with (grpc.secure_channel(address, credentials, options=CHANNEL_OPTIONS) if credentials
              else grpc.insecure_channel(address, options=CHANNEL_OPTIONS)) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                        timeout=timeout)
            return resp.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False
