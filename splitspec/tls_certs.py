"""Throwaway certificates: a CA and one certificate per service role, made with `cryptography`.

`splitspec up --tls` writes a set into a temporary directory so that the whole local stack runs
with mutual TLS in one flag; the tests and `make bench-tls` use the same. Not a PKI: a cluster
gets its certificates from cert-manager or its own CA (docs/deploy.md#tls).

Each service's certificate names the addresses it is dialled at (DNS names and IP addresses) and
its role as a URI (`spiffe://splitspec.local/<role>`), the identity that `--tls-allow-peer`
names; it serves both ways (server and client authentication), as the verifier does: a server
to the gateway, a client of the proposers.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLES = ("gateway", "verifier", "proposer", "client")  # client: an operator's or a probe's
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def role_identity(role: str, domain: str = "splitspec.local") -> str:
    """The URI subject alternative name that says a certificate's role."""
    return f"spiffe://{domain}/{role}"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _general_name(name: str) -> x509.GeneralName:
    if "://" in name:
        return x509.UniformResourceIdentifier(name)
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """`name`.pem and `name`.key in directory (the key readable by its owner only)."""
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        cert.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return cert, key


class Authority:
    """A self-signed CA that issues certificates."""

    def __init__(self, name: str = "splitspec local CA", days: float = 7.0):
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        self.cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256()))

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, names: Iterable[str], valid_from: dt.datetime | None = None,
              valid_until: dt.datetime | None = None, days: float = 7.0) -> Issued:
        """A certificate and key for `names` (DNS names, IP addresses, URIs), valid from five
        minutes ago for `days` unless the bounds are given (tests make expired ones)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        start = valid_from or now - dt.timedelta(minutes=5)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(valid_until or now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256()))
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def issue_role(self, role: str, hosts: Iterable[str] = LOCAL_HOSTS, **kwargs) -> Issued:
        return self.issue(f"splitspec {role}", [*hosts, role_identity(role)], **kwargs)


@dataclass(frozen=True)
class RoleFiles:
    cert: Path
    key: Path


@dataclass(frozen=True)
class StackCertificates:
    """Where a written set lies: the CA and one certificate per role."""

    directory: Path
    ca: Path
    roles: dict[str, RoleFiles]

    def __getitem__(self, role: str) -> RoleFiles:
        return self.roles[role]


def write_stack_certificates(directory: Path, hosts: Iterable[str] = LOCAL_HOSTS,
                             authority: Authority | None = None) -> StackCertificates:
    """A CA (ca.pem) and a certificate per role (ROLES: <role>.pem, <role>.key) for services
    dialled at `hosts`."""
    directory.mkdir(parents=True, exist_ok=True)
    authority = authority or Authority()
    ca = directory / "ca.pem"
    ca.write_bytes(authority.pem)
    hosts = tuple(dict.fromkeys(hosts))  # each once
    roles = {role: RoleFiles(*authority.issue_role(role, hosts).write(directory, role))
             for role in ROLES}
    return StackCertificates(directory, ca, roles)
