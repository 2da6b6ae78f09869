"""`splitspec-health`: one grpc.health.v1 check of a service on this pod, for the probes a kubelet
cannot make itself. Its native gRPC probe speaks plaintext only, so a service that serves TLS with
client certificates required (the chart's `tls.enabled`) is probed by this command instead, as an
exec probe presenting the pod's own certificate:

    splitspec-health --port 50051 --tls-cert /etc/splitspec/tls/tls.crt \\
        --tls-key /etc/splitspec/tls/tls.key --tls-ca /etc/splitspec/tls/ca.crt \\
        --server-name splitspec-verifier

Exit status 0 when the service answers SERVING, 1 otherwise (the status or error is printed).
It imports gRPC and nothing of the services, so a probe costs a Python start and one call.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="splitspec-health", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True, help="the service's gRPC port")
    p.add_argument("--host", default="127.0.0.1",
                   help="the service's address (default: %(default)s)")
    p.add_argument("--service", default="",
                   help="health service name (default: none, the whole server)")
    p.add_argument("--timeout-s", type=float, default=2.0,
                   help="seconds to wait for the answer (default: %(default)s)")
    p.add_argument("--tls-ca", default="", help="PEM CA the service's certificate chains to; "
                   "given: TLS (default: none, plaintext)")
    p.add_argument("--tls-cert", default="",
                   help="PEM certificate to present (default: none)")
    p.add_argument("--tls-key", default="", help="its PEM private key (default: none)")
    p.add_argument("--server-name", default="", help="a name the service's certificate holds "
                   "(default: --host)")
    return p


def check(args: argparse.Namespace) -> tuple[bool, str]:
    address = f"{args.host}:{args.port}"
    if args.tls_ca:
        key = Path(args.tls_key).read_bytes() if args.tls_key else None
        cert = Path(args.tls_cert).read_bytes() if args.tls_cert else None
        credentials = grpc.ssl_channel_credentials(Path(args.tls_ca).read_bytes(), key, cert)
        options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.insecure_channel(address)
    try:
        with channel:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout_s)
    except grpc.RpcError as exc:
        return False, f"{address}: {exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return resp.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def main(argv: Sequence[str] | None = None) -> None:
    try:
        ok, said = check(parser().parse_args(argv))
    except OSError as exc:
        ok, said = False, f"cannot read {exc.filename}: {exc.strerror}"
    print(said, flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
