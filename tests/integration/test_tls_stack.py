"""The whole stack over mutual TLS (one stack for the module; certificates made here, mounted like
Kubernetes secrets): it serves and stays lossless; every RPC of every service, found from the
generated descriptors, refuses every client without a valid certificate (0 unauthenticated
paths); each internal hop refuses another role's certificate with PERMISSION_DENIED and keeps
serving; plaintext to any TLS port fails at once; and every certificate is rotated under load
with no failed request."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
import threading

import grpc
import httpx
import openai
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from polling import wait_until
from tls_testlib import (
    bad_clients,
    calls,
    generated_services,
    presented_serial,
    role_client,
    secret_volume_certificates,
    serial_of,
)

from splitspec.launcher import Stack, StackConfig

pytestmark = pytest.mark.integration

API_KEY = "tls-test-key"
PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(", "for i in range(10):\n    print(i)\n"]
REFUSED_AT_HANDSHAKE = grpc.StatusCode.UNAVAILABLE


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return secret_volume_certificates(tmp_path_factory.mktemp("tls-secrets"))


@pytest.fixture(scope="module")
def tls_stack(target_model_dir, certs, tmp_path_factory):
    """n-gram proposer, verifier (lookahead in it) and gateway; every hop mutual TLS, the
    front doors requiring a client certificate and an API key."""
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(API_KEY + "\n")
    config = StackConfig.with_free_ports(
        model=target_model_dir, device="cpu", methods=["ngram", "lookahead"],
        log_dir=tmp_path_factory.mktemp("tls-logs"), tls=certs.stack,
        verifier_args=["--threads", "1"],
        gateway_args=["--tls-front-door-ca", str(certs.stack.ca), "--api-key-file", str(keys)])
    with Stack(config) as s:
        yield s


def https_context(certs, role: str = "client") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.stack.ca))
    context.load_cert_chain(str(certs.stack[role].cert), str(certs.stack[role].key))
    return context


@pytest.fixture(scope="module")
def client(tls_stack, certs):
    """The official client over HTTPS: trusting the CA, presenting the client certificate."""
    http = openai.DefaultHttpxClient(verify=https_context(certs))
    yield openai.OpenAI(base_url=tls_stack.url + "/v1", api_key=API_KEY, http_client=http,
                        max_retries=0)
    http.close()


def complete(client, prompt: str, speculation: dict, max_tokens: int = 24) -> str:
    out = client.completions.create(model="target", prompt=prompt, max_tokens=max_tokens,
                                    temperature=0, extra_body={"speculation": speculation})
    return out.choices[0].text


def ports(stack) -> dict[str, int]:
    return {"gateway": stack.config.grpc_port, "verifier": stack.verifier.port,
            **{f"proposer-{m}": svc.port for m, svc in stack.proposers.items()}}


def served_services(port: int, certs) -> list[str]:
    """What a port serves, as its reflection lists it (asked with a valid certificate)."""
    async def ask():
        credentials = role_client(certs, "client").credentials
        options = [("grpc.ssl_target_name_override", "localhost")]
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials,
                                           options=options) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
                list_services="")]))
            resp = await call.read()
            call.cancel()
            return [s.name for s in resp.list_services_response.service]

    return asyncio.run(ask())


def test_the_stack_serves_over_mutual_tls_and_greedy_output_is_lossless(client):
    for prompt in PROMPTS:
        off = complete(client, prompt, {"mode": "off"})
        assert off
        for method in ("ngram", "lookahead"):
            assert complete(client, prompt, {"mode": "on", "method": method,
                                             "num_speculative_tokens": 4}) == off, method


def test_no_rpc_of_any_service_is_reachable_without_a_valid_certificate(tls_stack, certs):
    """Every service and RPC from the generated descriptors, on every port that serves it
    (its reflection says which), against every bad client: 0 paths get through."""
    known = generated_services()
    seen, paths, unauthenticated = set(), 0, []
    for name, port in ports(tls_stack).items():
        services = served_services(port, certs)
        assert set(services) <= set(known), services
        seen.update(services)
        rpcs = [rpc for s in services for rpc in known[s]]
        for bad in bad_clients(certs):
            for method, code in calls(f"127.0.0.1:{port}", rpcs, bad).items():
                paths += 1
                if code is not REFUSED_AT_HANDSHAKE:
                    unauthenticated.append((name, method, bad.name, code.name))
    assert seen == set(known), f"services no port serves: {set(known) - seen}"
    print(f"\n{paths} (port, RPC, bad client) paths tried, {len(unauthenticated)} got through")
    assert unauthenticated == []


HOPS = {  # hop -> (the port's name, the service guarded, the role allowed)
    "gateway -> verifier": ("verifier", "splitspec.v1.Verifier", "gateway"),
    "verifier -> proposer": ("proposer-ngram", "splitspec.v1.Proposer", "verifier"),
}


def test_each_internal_hop_refuses_bad_clients_and_other_roles_and_keeps_serving(
        tls_stack, certs, client):
    known = generated_services()
    matrix = {}
    for hop, (name, service, allowed) in HOPS.items():
        port = ports(tls_stack)[name]
        rpcs = known[service]
        others = [role_client(certs, r) for r in ("gateway", "verifier", "proposer", "client")
                  if r != allowed]
        for bad, expected in [*((b, REFUSED_AT_HANDSHAKE) for b in bad_clients(certs)),
                              *((o, grpc.StatusCode.PERMISSION_DENIED) for o in others)]:
            codes = set(calls(f"127.0.0.1:{port}", rpcs, bad).values())
            matrix[hop, bad.name] = codes
            assert codes == {expected}, (hop, bad.name, codes)
        info = next(r for r in rpcs if r.method.endswith("/Info"))
        assert calls(f"127.0.0.1:{port}", [info], role_client(certs, allowed)) == {
            info.method: grpc.StatusCode.OK}
    # the front door: a verified client still needs an API key (it authenticates the caller)
    front = known["splitspec.v1.Generation"]
    port = ports(tls_stack)["gateway"]
    for bad in bad_clients(certs):
        matrix["client -> gateway", bad.name] = set(calls(f"127.0.0.1:{port}", front,
                                                          bad).values())
        assert matrix["client -> gateway", bad.name] == {REFUSED_AT_HANDSHAKE}
    keyless = role_client(certs, "client")
    matrix["client -> gateway", "client certificate, no API key"] = codes = set(
        calls(f"127.0.0.1:{port}", front, keyless).values())
    assert codes == {grpc.StatusCode.UNAUTHENTICATED}
    print("\nhop | client | status")
    for (hop, bad), codes in matrix.items():
        print(f"{hop} | {bad} | {', '.join(sorted(c.name for c in codes))}")
    assert complete(client, PROMPTS[0], {"mode": "on", "method": "ngram"})  # still serving


def test_plaintext_and_certificate_less_clients_fail_at_once_at_the_rest_door(tls_stack, certs):
    plain = tls_stack.url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(plain + "/health", timeout=5)
    no_cert = ssl.create_default_context(cafile=str(certs.stack.ca))
    with pytest.raises((httpx.HTTPError, ssl.SSLError)):
        httpx.get(tls_stack.url + "/health", verify=no_cert, timeout=5).raise_for_status()
    ok = httpx.get(tls_stack.url + "/health", verify=https_context(certs), timeout=5)
    assert ok.status_code == 200


def test_the_health_probe_command_checks_every_port_over_mutual_tls(tls_stack, certs):
    """What the chart's exec probes run: SERVING with the pod's own certificate, a failure
    (exit 1) without one."""
    def probe(port: int, *tls: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "splitspec.health_probe", "--port",
                               str(port), *tls], capture_output=True, text=True, timeout=60)

    for role, port in (("gateway", tls_stack.config.grpc_port),
                       ("verifier", tls_stack.verifier.port),
                       ("proposer", ports(tls_stack)["proposer-ngram"])):
        files = certs.stack[role]
        ok = probe(port, "--tls-ca", str(certs.stack.ca), "--tls-cert", str(files.cert),
                   "--tls-key", str(files.key), "--server-name", "localhost")
        assert ok.returncode == 0 and "SERVING" in ok.stdout, ok.stdout + ok.stderr
        plain = probe(port)
        assert plain.returncode == 1 and "UNAVAILABLE" in plain.stdout, plain.stdout


def test_every_certificate_is_rotated_under_load_without_a_failed_request(tls_stack, certs,
                                                                           client):
    """Four clients send requests (speculating through the proposer) while the proposer's,
    the verifier's and the gateway's certificates are replaced in place, one after the other;
    each port must present its new certificate to new connections, the gateway must dial the
    verifier anew, and no request may fail."""
    stop, lock = threading.Event(), threading.Lock()
    counts = {"requests": 0, "failed": 0}
    errors = []

    def load(i: int) -> None:
        while not stop.is_set():
            try:
                complete(client, PROMPTS[i % 2], {"mode": "on", "method": "ngram"}, 8)
                ok = True
            except Exception as exc:  # noqa: BLE001 - counted, shown below
                ok = False
                errors.append(repr(exc))
            with lock:
                counts["requests"] += 1
                counts["failed"] += not ok

    workers = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    try:
        probe = certs.stack["client"]
        for role, port in (("proposer", ports(tls_stack)["proposer-ngram"]),
                           ("verifier", tls_stack.verifier.port),
                           ("gateway", tls_stack.config.grpc_port),
                           ("gateway", tls_stack.config.http_port)):
            new = (serial_of(certs.rotate(role).cert_pem) if port != tls_stack.config.http_port
                   else serial_of(certs.stack["gateway"].cert.read_bytes()))
            wait_until(lambda: presented_serial(port, probe, certs.stack.ca) == new, 30, 0.1,
                       f"{role} to present its new certificate on port {port}")
        log = tls_stack.config.log_dir / "gateway.log"
        wait_until(lambda: "new calls use a new channel" in log.read_text(), 30, 0.1,
                   "the gateway to dial the verifier with its new certificate")
        after = counts["requests"]
        wait_until(lambda: counts["requests"] >= after + 16, 60, 0.1, "requests after rotation")
    finally:
        stop.set()
        for w in workers:
            w.join(60)
    print(f"\nrotation under load: {counts['requests']} requests, {counts['failed']} failed")
    assert counts["failed"] == 0, errors[:3]
    assert complete(client, PROMPTS[0], {"mode": "on", "method": "ngram"})
