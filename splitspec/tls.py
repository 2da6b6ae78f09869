"""TLS credentials of every service, from PEM files: checked when read, read again when they change.

What the flags (splitspec/tls_options.py) become:

- `ServerTls`: the certificate a server presents and, given a CA, the client certificates it
  requires (mutual TLS). A gRPC server gets dynamic credentials: gRPC asks their fetcher at every
  new handshake, and it answers with the new certificate once the files changed, so new
  connections get it while established ones carry on. The REST door's `ssl.SSLContext` is
  reloaded the same way (gateway/http_server.py).
- `ClientTls`: the CA a client checks servers against and the certificate it presents; a change
  makes the channels of splitspec/grpc_server.py's `Dialer` open anew (calls already running on
  the previous channel go on).
- `PeerCheck`: the optional allow-list of client identities (`--tls-allow-peer`): the subject
  alternative names (DNS or URI) of a verified client certificate, checked per call by the
  server's interceptor; another role's certificate gets PERMISSION_DENIED. Health and reflection
  are open to any certificate the CA signed (probes present the pod's own).

A certificate must be valid now: one that is expired or not yet valid, a key that is not the
certificate's, a file that is missing or does not parse, is refused with one line naming the
file: at start as a StartupError (the service exits with that line), on rotation as an error in
the log while the current certificate stays in use (and is retried when the files change again).
Files are looked at at most once a second (a stat of each: a Kubernetes secret volume swaps a
symlink, so every path's inode changes at once); a certificate in use that expires is logged
once, loudly, since peers will refuse it.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
import time
from dataclasses import dataclass
from typing import Iterable

import grpc

from splitspec.errors import PermissionDenied, StartupError

# `cryptography` is imported where a certificate is read: a plaintext service never pays for it.

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0  # files are looked at no more often than this
# Methods any client with a verified certificate may call, whatever --tls-allow-peer says.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class CertificateError(ValueError):
    """A PEM file that cannot serve: its message names the file and what is wrong."""


@dataclass(frozen=True)
class Certificate:
    """A PEM certificate chain as read (its first certificate is the one presented)."""

    pem: bytes
    subject: str
    serial: int
    not_before: dt.datetime
    not_after: dt.datetime
    names: tuple[str, ...]  # DNS and URI subject alternative names

    def describe(self) -> str:
        names = ", ".join(self.names) or "no names"
        return (f"certificate serial {self.serial:x} ({self.subject or '-'}, {names}; "
                f"valid until {_when(self.not_after)})")

    def expired(self, now: dt.datetime | None = None) -> bool:
        return (now or _now()) > self.not_after


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _when(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CertificateError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def _pem_certificates(path: str, data: bytes) -> list:
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertificateError(f"{path}: holds no PEM certificate") from None


def read_certificate(path: str, now: dt.datetime | None = None) -> Certificate:
    """The chain in `path`, refused (CertificateError) unless its first certificate is valid now."""
    data = _read(path)
    leaf = _pem_certificates(path, data)[0]
    now = now or _now()
    cert = Certificate(data, leaf.subject.rfc4514_string(), leaf.serial_number,
                       leaf.not_valid_before_utc, leaf.not_valid_after_utc, _names(leaf))
    if now < cert.not_before:
        raise CertificateError(f"{path}: {cert.describe()} is not yet valid: not before "
                               f"{_when(cert.not_before)}")
    if cert.expired(now):
        raise CertificateError(f"{path}: {cert.describe()} expired at {_when(cert.not_after)}")
    return cert


def _names(cert) -> tuple[str, ...]:
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    return tuple(san.get_values_for_type(x509.DNSName)
                 + san.get_values_for_type(x509.UniformResourceIdentifier)
                 + [str(ip) for ip in san.get_values_for_type(x509.IPAddress)])


def read_key(path: str, cert_path: str) -> bytes:
    """The private key in `path`, refused unless it is the key of the certificate in cert_path."""
    from cryptography.hazmat.primitives import serialization

    data = _read(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"{path}: not a PEM private key without a password ({exc})"
                               ) from None
    leaf = _pem_certificates(cert_path, _read(cert_path))[0]
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
        raise CertificateError(f"{path}: is not the private key of the certificate in {cert_path}")
    return data


def read_ca(path: str) -> bytes:
    data = _read(path)
    _pem_certificates(path, data)
    return data


@dataclass(frozen=True)
class Material:
    """One consistent read of a role's files."""

    certificate: Certificate | None  # what is presented (None: nothing)
    key: bytes | None
    ca: bytes | None  # PEM bundle peers are checked against (None: not checked / none)


class TlsFiles:
    """The files of one role (`what`, e.g. "verifier server"): a certificate and its key, a CA,
    or both; read and checked at start (StartupError naming the flag's file), read again by
    refresh() when they change."""

    def __init__(self, what: str, cert: str = "", key: str = "", ca: str = "",
                 check_interval_s: float = CHECK_INTERVAL_S):
        self.what, self.cert, self.key, self.ca = what, cert, key, ca
        self.check_interval_s = check_interval_s
        try:
            self.current = self._read()
        except CertificateError as exc:
            raise StartupError(f"TLS ({what}): {exc}") from None
        self.generation = 0  # +1 at every change taken
        self._signature = self._stat()
        self._refused: tuple | None = None  # the files' signature when they were last refused
        self._next_look = time.monotonic() + check_interval_s
        self._expiry_reported = False

    @property
    def paths(self) -> list[str]:
        return [p for p in (self.cert, self.key, self.ca) if p]

    def _read(self) -> Material:
        cert = read_certificate(self.cert) if self.cert else None
        key = read_key(self.key, self.cert) if self.cert else None
        return Material(cert, key, read_ca(self.ca) if self.ca else None)

    def _stat(self) -> tuple:
        out = []
        for path in self.paths:
            try:
                st = os.stat(path)
                out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    def refresh(self, force: bool = False) -> bool:
        """Read the files again if they changed since the last look (at most one look per
        check_interval_s unless `force`); True when a new, valid set replaced the current one."""
        now = time.monotonic()
        if not force and now < self._next_look:
            return False
        self._next_look = now + self.check_interval_s
        self._report_expiry()
        signature = self._stat()
        if signature in (self._signature, self._refused):
            return False
        try:
            material = self._read()
        except CertificateError as exc:
            self._refused = signature
            log.error("TLS (%s): refusing the changed files: %s; still presenting %s", self.what,
                      exc, self._presented())
            return False
        self.current, self._signature, self._refused = material, signature, None
        self.generation += 1
        self._expiry_reported = False
        log.info("TLS (%s): files changed; now %s%s", self.what, self._presented(),
                 f", CA from {self.ca}" if self.ca else "")
        return True

    def _presented(self) -> str:
        c = self.current.certificate
        return f"{c.describe()} from {self.cert}" if c else "no certificate"

    def _report_expiry(self) -> None:
        c = self.current.certificate
        if c is not None and not self._expiry_reported and c.expired():
            self._expiry_reported = True
            log.error("TLS (%s): %s in %s has expired: peers refuse it; rotate it", self.what,
                      c.describe(), self.cert)


class PeerCheck:
    """Which client identities may call a server's RPCs (health and reflection: any verified
    client). Raises PermissionDenied, naming the caller, for any other."""

    def __init__(self, allowed: Iterable[str]):
        self.allowed = frozenset(allowed)

    def __call__(self, method: str, context: grpc.aio.ServicerContext) -> None:
        if method.startswith(OPEN_METHOD_PREFIXES):
            return
        names = {n.decode() if isinstance(n, bytes) else n
                 for n in (context.peer_identities() or ())}
        if not names & self.allowed:
            raise PermissionDenied(
                f"{method}: the caller ({', '.join(sorted(names)) or 'no verified identity'}) "
                f"is not allowed to call this service (allowed: {', '.join(sorted(self.allowed))})")


class ServerTls:
    """A server's side: what it presents, and the client certificates it requires when its
    files have a CA."""

    def __init__(self, files: TlsFiles, peers: PeerCheck | None = None):
        if files.current.certificate is None:
            raise StartupError(f"TLS ({files.what}): a server needs a certificate and its key")
        self.files, self.peers = files, peers

    @property
    def requires_client_certificate(self) -> bool:
        return self.files.current.ca is not None

    def _configuration(self):
        m = self.files.current
        return grpc.ssl_server_certificate_configuration([(m.key, m.certificate.pem)],
                                                         root_certificates=m.ca)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Dynamic credentials: every new handshake asks the fetcher, which hands gRPC the new
        certificate (and CA) once the files changed and passed the checks."""
        seen = [self.files.generation]

        def fetch():
            self.files.refresh()
            if self.files.generation == seen[0]:
                return None  # no change: keep the current configuration
            seen[0] = self.files.generation
            return self._configuration()

        return grpc.dynamic_ssl_server_credentials(
            self._configuration(), fetch,
            require_client_authentication=self.requires_client_certificate)

    def ssl_context(self) -> ssl.SSLContext:
        """A context for an HTTPS server (TLS 1.2+, a client certificate required with a CA);
        `reload(context)` puts a rotated certificate into it."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.files.cert, self.files.key)
        if self.requires_client_certificate:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cadata=self.files.current.ca.decode())
        context.set_alpn_protocols(["http/1.1"])
        return context

    def reload(self, context: ssl.SSLContext, seen_generation: int) -> int:
        """Load the files into `context` when they changed after `seen_generation`; returns the
        generation it now holds. Connections opened later get the new certificate."""
        self.files.refresh()
        if self.files.generation == seen_generation:
            return seen_generation
        try:
            context.load_cert_chain(self.files.cert, self.files.key)
            if self.requires_client_certificate:
                context.load_verify_locations(cadata=self.files.current.ca.decode())
        except (ssl.SSLError, OSError) as exc:
            log.error("TLS (%s): cannot load the changed files into HTTPS: %s", self.files.what,
                      exc)
            return seen_generation
        return self.files.generation


class ClientTls:
    """A client's side: the CA the servers it dials must chain to, and what it presents."""

    def __init__(self, files: TlsFiles):
        if files.current.ca is None:
            raise StartupError(f"TLS ({files.what}): a client needs --tls-ca to check servers")
        self.files = files

    @property
    def generation(self) -> int:
        return self.files.generation

    def refresh(self) -> bool:
        return self.files.refresh()

    def credentials(self) -> grpc.ChannelCredentials:
        m = self.files.current
        return grpc.ssl_channel_credentials(m.ca, m.key,
                                            m.certificate.pem if m.certificate else None)


def server_tls(options, what: str, client_ca: str | None = None) -> ServerTls | None:
    """The server side of a service's TLS flags (TlsServerOptions, with TlsPeerOptions where it
    has them); None: plaintext. `client_ca` replaces --tls-ca as the CA of client certificates
    (the gateway's front doors, where it is --tls-front-door-ca)."""
    cert, key = options.tls_cert, options.tls_key
    ca = options.tls_ca if client_ca is None else client_ca
    allowed = tuple(getattr(options, "tls_allow_peer", ()))
    if bool(cert) != bool(key):
        raise StartupError(f"TLS ({what}): --tls-cert and --tls-key go together")
    if allowed and not ca:
        raise StartupError(f"TLS ({what}): --tls-allow-peer names identities of client "
                           "certificates: it needs --tls-ca")
    if not cert:
        if ca:
            flag = "--tls-ca" if client_ca is None else "--tls-front-door-ca"
            raise StartupError(f"TLS ({what}): {flag} requires client certificates, so this "
                               "service needs its own --tls-cert and --tls-key too")
        return None
    return ServerTls(TlsFiles(what, cert, key, ca), PeerCheck(allowed) if allowed else None)


def client_tls(options, what: str) -> ClientTls | None:
    """The client side of a service's TLS flags (TlsServerOptions + TlsClientOptions): --tls-ca,
    and --tls-client-cert/--tls-client-key (default: --tls-cert/--tls-key); None: plaintext."""
    cert = options.tls_client_cert or options.tls_cert
    key = options.tls_client_key or options.tls_key
    if bool(options.tls_client_cert) != bool(options.tls_client_key):
        raise StartupError(f"TLS ({what}): --tls-client-cert and --tls-client-key go together")
    if not options.tls_ca:
        if options.tls_client_cert:
            raise StartupError(f"TLS ({what}): --tls-client-cert needs --tls-ca (the CA the "
                               "servers' certificates are checked against)")
        return None
    return ClientTls(TlsFiles(what, cert, key, options.tls_ca))
