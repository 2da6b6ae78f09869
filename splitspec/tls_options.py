"""The TLS flags, declared once and mixed into each service's config dataclass.

| mixin | flags | services |
|---|---|---|
| `TlsServerOptions` | `--tls-cert`, `--tls-key`, `--tls-ca` | gateway, verifier, proposers |
| `TlsPeerOptions` | `--tls-allow-peer` (repeatable) | verifier, proposers |
| `TlsClientOptions` | `--tls-client-cert`, `--tls-client-key` | gateway, verifier (they dial) |

Every flag is empty by default: plaintext, as `make run` serves. What the files become
(credentials, rotation, the caller check) is splitspec/tls.py's; the gRPC plumbing that uses them
is splitspec/grpc_server.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from splitspec.config import option

GROUP = "TLS (docs/deploy.md#tls; every flag empty: plaintext)"


@dataclass(frozen=True)
class TlsServerOptions:
    tls_cert: str = option(
        "", "PEM certificate chain this service presents; with --tls-key its gRPC port serves "
        "TLS only (the gateway's REST door HTTPS too); re-read when the file changes",
        group=GROUP)
    tls_key: str = option("", "PEM private key of --tls-cert", group=GROUP)
    tls_ca: str = option(
        "", "PEM CA bundle: the servers this service dials must present a certificate it signed; "
        "on the verifier and proposers also its clients (mutual TLS)", group=GROUP)


@dataclass(frozen=True)
class TlsPeerOptions:
    tls_allow_peer: tuple[str, ...] = option(
        (), "a client identity (a DNS or URI subject alternative name of its certificate) that "
        "may call this service's RPCs; none: any certificate --tls-ca signed (health and "
        "reflection stay open to those)", group=GROUP)


@dataclass(frozen=True)
class TlsClientOptions:
    tls_client_cert: str = option(
        "", "PEM certificate chain presented to the services this one dials (default: "
        "--tls-cert)", group=GROUP)
    tls_client_key: str = option("", "PEM private key of --tls-client-cert (default: --tls-key)",
                                 group=GROUP)
