"""TLS credentials and the shared gRPC plumbing, in process, with certificates made in the test:
files checked when read (expired, not yet valid, foreign key, garbage: one line naming the file),
the flags' combinations, rotation taken from a secret-volume swap (a bad one refused and the
current certificate kept), a server that refuses every bad client at the handshake and another
role's certificate per call, and a client that re-dials after rotation while its open stream
goes on."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging

import grpc
import planted_bugs as bug
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from polling import wait_until, wait_until_async
from tls_testlib import (
    Rpc,
    bad_clients,
    calls,
    presented_serial,
    role_client,
    role_identity,
    secret_volume_certificates,
    serial_of,
)

from splitspec import grpc_server
from splitspec.errors import StartupError
from splitspec.net import free_port
from splitspec.tls import ClientTls, PeerCheck, ServerTls, TlsFiles, client_tls, server_tls
from splitspec.tls_certs import Authority
from splitspec.tls_options import TlsClientOptions, TlsPeerOptions, TlsServerOptions

NOW = dt.datetime.now(dt.timezone.utc)
GUARDED = Rpc("splitspec.v1.Proposer", "/splitspec.v1.Proposer/Info", False, False)
HEALTH = Rpc("grpc.health.v1.Health", "/grpc.health.v1.Health/Check", False, False)


@dataclasses.dataclass(frozen=True)
class Options(TlsServerOptions, TlsPeerOptions, TlsClientOptions):
    pass


@pytest.fixture
def certs(tmp_path):
    return secret_volume_certificates(tmp_path / "certs")


def write(tmp_path, name, issued):
    return issued.write(tmp_path, name)


# -- reading ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case,words", [
    ("expired", "expired at"),
    ("not yet valid", "is not yet valid"),
    ("foreign key", "is not the private key of the certificate"),
    ("garbage", "holds no PEM certificate"),
    ("missing", "cannot read it"),
])
def test_a_certificate_that_cannot_serve_is_refused_at_start_naming_the_file(tmp_path, case,
                                                                            words):
    ca = Authority()
    good = ca.issue_role("verifier")
    issued = {
        "expired": ca.issue_role("verifier", valid_from=NOW - dt.timedelta(days=2),
                                 valid_until=NOW - dt.timedelta(days=1)),
        "not yet valid": ca.issue_role("verifier", valid_from=NOW + dt.timedelta(days=1),
                                       valid_until=NOW + dt.timedelta(days=2)),
        "foreign key": dataclasses.replace(good, key_pem=ca.issue_role("x").key_pem),
    }.get(case, good)
    cert, key = write(tmp_path, "verifier", issued)
    if case == "garbage":
        cert.write_text("not a certificate\n")
    if case == "missing":
        cert.unlink()
    with pytest.raises(StartupError) as exc:
        TlsFiles("verifier", str(cert), str(key))
    line = str(exc.value)
    assert "\n" not in line and words in line
    assert str(key if case == "foreign key" else cert) in line


@pytest.mark.parametrize("flags,words", [
    ({"tls_cert": "c.pem"}, "--tls-cert and --tls-key go together"),
    ({"tls_allow_peer": ("x",)}, "--tls-allow-peer"),
    ({"tls_ca": "ca.pem"}, "needs its own --tls-cert"),
])
def test_server_flags_that_do_not_go_together_are_refused(flags, words):
    with pytest.raises(StartupError, match=words):
        server_tls(Options(**flags), "verifier")


def test_client_flags_that_do_not_go_together_are_refused():
    with pytest.raises(StartupError, match="--tls-client-cert needs --tls-ca"):
        client_tls(Options(tls_client_cert="c", tls_client_key="k"), "gateway")
    with pytest.raises(StartupError, match="go together"):
        client_tls(Options(tls_client_cert="c", tls_ca="ca"), "gateway")
    assert server_tls(Options(), "verifier") is None and client_tls(Options(), "x") is None


# -- rotation --------------------------------------------------------------------------------

def test_rotation_takes_a_valid_new_certificate_and_refuses_a_bad_one(certs, caplog):
    files = TlsFiles("verifier", str(certs.stack["verifier"].cert),
                     str(certs.stack["verifier"].key), str(certs.stack.ca), check_interval_s=0)
    first = files.current.certificate.serial
    assert not files.refresh()  # nothing changed
    new = certs.rotate("verifier")
    assert files.refresh() and files.generation == 1
    assert files.current.certificate.serial == serial_of(new.cert_pem) != first
    expired = certs.authority.issue_role("verifier", valid_from=NOW - dt.timedelta(days=2),
                                         valid_until=NOW - dt.timedelta(days=1))
    certs.volumes["verifier"].update({"tls.crt": expired.cert_pem, "tls.key": expired.key_pem,
                                      "ca.crt": certs.authority.pem})
    with caplog.at_level(logging.ERROR, logger="splitspec.tls"):
        assert not files.refresh()
    assert files.current.certificate.serial == serial_of(new.cert_pem)  # kept
    (record,) = [r for r in caplog.records if "refusing the changed files" in r.getMessage()]
    assert "expired at" in record.getMessage() and "still presenting" in record.getMessage()
    assert not files.refresh()  # refused once, not again and again
    certs.rotate("verifier")
    assert files.refresh() and files.generation == 2


# -- a server ---------------------------------------------------------------------------------

class Server:
    """An in-process server over the shared plumbing: health, reflection and a guarded
    method, with the verifier's certificate, clients required, only the gateway allowed."""

    def __init__(self, certs, allowed=("gateway",)):
        files = TlsFiles("test server", str(certs.stack["verifier"].cert),
                         str(certs.stack["verifier"].key), str(certs.stack.ca),
                         check_interval_s=0.05)
        self.tls = ServerTls(files, PeerCheck(role_identity(r) for r in allowed))
        self.port = free_port()

    async def __aenter__(self):
        self.server = grpc_server.make_server(self.tls)
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "splitspec.v1.Proposer",
            {"Info": grpc.unary_unary_rpc_method_handler(self._info)})])
        self.health = grpc_server.add_health_and_reflection(self.server, [])
        grpc_server.listen(self.server, f"127.0.0.1:{self.port}", self.tls)
        await self.server.start()
        await grpc_server.mark_serving(self.health, [])
        return self

    @staticmethod
    async def _info(request, context):
        return b""

    async def __aexit__(self, *exc):
        await self.server.stop(0)


def run_server(certs, check):
    """Start a Server on an event loop in another thread while `check(server)` runs here."""
    import threading

    ready, done = threading.Event(), threading.Event()
    box = {}

    async def main():
        async with Server(certs) as server:
            box["server"] = server
            ready.set()
            while not done.is_set():
                await asyncio.sleep(0.02)

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        return check(box["server"])
    finally:
        done.set()
        thread.join(10)


def check_refusals(certs) -> None:
    """Every bad client is refused at the handshake on every method, another role per call
    (health open to it), the allowed role served."""
    def check(server):
        address = f"127.0.0.1:{server.port}"
        for client in bad_clients(certs):
            assert set(calls(address, [GUARDED, HEALTH], client).values()) == {
                grpc.StatusCode.UNAVAILABLE}, client.name
        wrong = calls(address, [GUARDED, HEALTH], role_client(certs, "proposer"))
        assert wrong == {GUARDED.method: grpc.StatusCode.PERMISSION_DENIED,
                         HEALTH.method: grpc.StatusCode.OK}
        right = calls(address, [GUARDED, HEALTH], role_client(certs, "gateway"))
        assert set(right.values()) == {grpc.StatusCode.OK}

    run_server(certs, check)


def test_a_tls_server_refuses_bad_clients_and_other_roles(certs):
    check_refusals(certs)


def test_the_check_catches_a_server_that_listens_in_plaintext(certs, monkeypatch):
    bug.server_listens_plaintext(monkeypatch)
    with pytest.raises(AssertionError, match="plaintext"):
        check_refusals(certs)


def test_the_check_catches_a_skipped_caller_check(certs, monkeypatch):
    bug.caller_check_skipped(monkeypatch)
    with pytest.raises(AssertionError, match="PERMISSION_DENIED"):
        check_refusals(certs)


def check_server_rotation(certs, timeout_s: float = 10.0) -> None:
    def check(server):
        client = certs.stack["gateway"]
        before = presented_serial(server.port, client, certs.stack.ca)
        assert before == serial_of(certs.stack["verifier"].cert.read_bytes())
        new = serial_of(certs.rotate("verifier").cert_pem)
        wait_until(lambda: presented_serial(server.port, client, certs.stack.ca) == new,
                   timeout_s, 0.1, "the server to present the rotated certificate")

    run_server(certs, check)


def test_a_server_presents_a_rotated_certificate_to_new_connections(certs):
    check_server_rotation(certs)


def test_the_check_catches_a_server_that_ignores_rotation(certs, monkeypatch):
    bug.certificate_rotation_ignored(monkeypatch)
    with pytest.raises(AssertionError, match="rotated certificate"):
        check_server_rotation(certs, timeout_s=2.0)


# -- a client ---------------------------------------------------------------------------------

def test_a_client_redials_after_rotation_and_its_open_stream_goes_on(certs):
    """After the client's files change, new calls go over a new channel (the new certificate);
    a Watch stream opened before keeps receiving on the old one."""
    async def scenario(server):
        tls = ClientTls(TlsFiles("test client", str(certs.stack["gateway"].cert),
                                 str(certs.stack["gateway"].key), str(certs.stack.ca),
                                 check_interval_s=0))
        dialer = grpc_server.Dialer(f"127.0.0.1:{server.port}", tls, "localhost")
        first = dialer.channel()
        watch = health_pb2_grpc.HealthStub(first).Watch(health_pb2.HealthCheckRequest())
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        certs.rotate("gateway")
        second = await wait_until_async(lambda: dialer.channel() is not first and dialer.channel(),
                                        5.0, 0.01, "a new channel after rotation")
        assert dialer.redials == 1
        await health_pb2_grpc.HealthStub(second).Check(health_pb2.HealthCheckRequest(),
                                                       timeout=5)
        await grpc_server.mark_not_serving(server.health, [])
        update = await asyncio.wait_for(watch.read(), 5)  # the old stream still delivers
        assert update.status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
        await dialer.close()

    async def main():
        async with Server(certs) as server:
            await scenario(server)

    asyncio.run(main())
