"""Certificates and clients for the TLS tests: a stack's certificates laid out like a mounted
Kubernetes secret (each file a symlink through `..data`, rotated by swapping that one link, as the
kubelet does), the bad clients every hop must refuse, every RPC of every service from the
generated descriptors, and one call of any of them with any credentials."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

import protos
from splitspec.tls_certs import (
    ROLES,
    Authority,
    Issued,
    RoleFiles,
    StackCertificates,
    role_identity,
)


class SecretVolume:
    """A directory laid out as the kubelet mounts a secret: `<name>` -> `..data/<name>`, and
    `..data` -> a timestamped directory; `update` writes a new one and swaps the link atomically."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._version = 0

    def update(self, files: dict[str, bytes]) -> None:
        self._version += 1
        version = self.root / f"..{self._version:04d}"
        version.mkdir()
        for name, data in files.items():
            (version / name).write_bytes(data)
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(Path("..data") / name)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, self.root / "..data")


@dataclass
class TestCertificates:
    """A stack's certificates in secret volumes, and the means to make bad ones."""

    authority: Authority
    stack: StackCertificates
    volumes: dict[str, SecretVolume]

    def rotate(self, role: str) -> Issued:
        """A new certificate for `role` from the same CA, swapped in like a secret update."""
        issued = self.authority.issue_role(role)
        self.volumes[role].update({"tls.crt": issued.cert_pem, "tls.key": issued.key_pem,
                                   "ca.crt": self.authority.pem})
        return issued


def secret_volume_certificates(root: Path) -> TestCertificates:
    """A CA and a certificate per role (splitspec/tls_certs.py ROLES), each role's files in a
    secret volume of its own (tls.crt, tls.key, ca.crt)."""
    authority = Authority()
    volumes, roles = {}, {}
    for role in ROLES:
        volume = volumes[role] = SecretVolume(root / role)
        issued = authority.issue_role(role)
        volume.update({"tls.crt": issued.cert_pem, "tls.key": issued.key_pem,
                       "ca.crt": authority.pem})
        roles[role] = RoleFiles(volume.root / "tls.crt", volume.root / "tls.key")
    stack = StackCertificates(root, volumes["client"].root / "ca.crt", roles)
    return TestCertificates(authority, stack, volumes)


# -- clients ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Client:
    """How a test client dials: None credentials is plaintext."""

    name: str
    credentials: grpc.ChannelCredentials | None


def bad_clients(certs: TestCertificates) -> list[Client]:
    """Clients every TLS port must refuse at the handshake: plaintext, TLS without a
    certificate, a certificate of another CA, an expired one and a not yet valid one (both
    from the right CA)."""
    ca = certs.authority.pem
    other = Authority("another CA").issue_role("gateway")
    now = dt.datetime.now(dt.timezone.utc)
    expired = certs.authority.issue_role("gateway", valid_from=now - dt.timedelta(days=2),
                                         valid_until=now - dt.timedelta(days=1))
    early = certs.authority.issue_role("gateway", valid_from=now + dt.timedelta(days=1),
                                       valid_until=now + dt.timedelta(days=2))
    return [
        Client("plaintext", None),
        Client("no certificate", grpc.ssl_channel_credentials(ca)),
        Client("another CA", grpc.ssl_channel_credentials(ca, other.key_pem, other.cert_pem)),
        Client("expired", grpc.ssl_channel_credentials(ca, expired.key_pem, expired.cert_pem)),
        Client("not yet valid", grpc.ssl_channel_credentials(ca, early.key_pem, early.cert_pem)),
    ]


def role_client(certs: TestCertificates, role: str) -> Client:
    files = certs.stack[role]
    return Client(f"{role} certificate", grpc.ssl_channel_credentials(
        certs.stack.ca.read_bytes(), files.key.read_bytes(), files.cert.read_bytes()))


# -- every RPC -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rpc:
    service: str  # full name
    method: str  # full path /service/Method
    client_streaming: bool
    server_streaming: bool


def generated_services() -> dict[str, list[Rpc]]:
    """Every service of the generated stubs: the product's (protos/*_pb2.py) plus gRPC health
    and reflection, which every server also serves; full name -> its RPCs."""
    import importlib
    import pkgutil

    files = [health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR]
    for info in pkgutil.iter_modules(protos.__path__):
        if info.name.endswith("_pb2"):
            files.append(importlib.import_module(f"protos.{info.name}").DESCRIPTOR)
    out = {}
    for f in files:
        for service in f.services_by_name.values():
            out[service.full_name] = [
                Rpc(service.full_name, f"/{service.full_name}/{m.name}", m.client_streaming,
                    m.server_streaming) for m in service.methods]
    return out


async def call(address: str, rpc: Rpc, client: Client,
               timeout_s: float = 15.0) -> grpc.StatusCode:
    """One call of `rpc` with an empty request (a client stream: none) on a fresh channel: the
    status it ends with (OK for a stream that sent a first message)."""
    options = [("grpc.ssl_target_name_override", "localhost")] if client.credentials else []
    channel = (grpc.aio.secure_channel(address, client.credentials, options=options)
               if client.credentials else grpc.aio.insecure_channel(address))
    try:
        kind = ("stream" if rpc.client_streaming else "unary") + "_" + (
            "stream" if rpc.server_streaming else "unary")
        multicallable = getattr(channel, kind)(rpc.method)
        try:
            if rpc.client_streaming:
                # half-closed with no message: the guard runs when the call arrives, before any
                # message, and the asyncio client turns a write that lands after the server has
                # ended the call into its own INTERNAL, hiding the server's status (grpc/grpc
                # issue 36066); a half-close does not
                ongoing = multicallable(timeout=timeout_s)
                # a call already refused fails its half-close: its status is read below
                with contextlib.suppress(Exception):
                    await ongoing.done_writing()
            else:
                ongoing = multicallable(b"", timeout=timeout_s)
            if rpc.server_streaming:
                if await ongoing.read() is grpc.aio.EOF:
                    return await ongoing.code()
                ongoing.cancel()
            else:
                await ongoing
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK
    finally:
        await channel.close()


def calls(address: str, rpcs: list[Rpc], client: Client) -> dict[str, grpc.StatusCode]:
    async def all_of_them():
        return await asyncio.gather(*(call(address, r, client) for r in rpcs))

    return {r.method: code for r, code in zip(rpcs, asyncio.run(all_of_them()))}


def presented_serial(port: int, client: RoleFiles, ca: Path, host: str = "127.0.0.1") -> int:
    """The serial number of the certificate a TLS port presents to a new connection (gRPC ports
    need ALPN h2; HTTPS takes it too)."""
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False
    context.load_cert_chain(str(client.cert), str(client.key))
    context.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection((host, port), timeout=5) as raw:
        with context.wrap_socket(raw) as tls:
            der = tls.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


def serial_of(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


__all__ = ["Client", "Rpc", "SecretVolume", "TestCertificates", "bad_clients", "call", "calls",
           "generated_services", "presented_serial", "role_client", "role_identity",
           "secret_volume_certificates", "serial_of"]
