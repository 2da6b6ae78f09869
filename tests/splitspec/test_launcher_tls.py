"""`splitspec up --tls`: a throwaway CA and a certificate per role, and every service's command
line wired for mutual TLS (verifiers serve only the gateway, proposers only verifiers)."""

from __future__ import annotations

import argparse

from splitspec.launcher import Stack
from splitspec.launcher.up import add_command, stack_config
from splitspec.tls import TlsFiles
from splitspec.tls_certs import ROLES, role_identity, write_stack_certificates


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_command(parser.add_subparsers())
    return parser.parse_args(["up", *argv])


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_up_tls_wires_every_service_for_mutual_tls(tmp_path, target_model_dir):
    args = parsed("--tls", "--model", target_model_dir, "--no-suffix")
    certs = write_stack_certificates(tmp_path)
    for role in ROLES:  # each one loads: valid now, its key, the CA
        TlsFiles(role, str(certs[role].cert), str(certs[role].key), str(certs.ca))
    stack = Stack(stack_config(args, certs))
    assert stack.url.startswith("https://")
    callers = {"proposer": [role_identity("verifier")], "verifier": [role_identity("gateway")],
               "gateway": []}
    assert {svc.name.split("-")[0] for svc in stack.services} == set(callers)
    for svc in stack.services:
        role = svc.name.split("-")[0]
        assert flag_values(svc.argv, "--tls-cert") == [str(certs[role].cert)], svc.name
        assert flag_values(svc.argv, "--tls-ca") == [str(certs.ca)], svc.name
        assert flag_values(svc.argv, "--tls-allow-peer") == callers[role], svc.name
    assert stack.health_credentials is not None
    plain = Stack(stack_config(parsed("--model", target_model_dir)))
    assert all("--tls-cert" not in svc.argv for svc in plain.services)
    assert plain.url.startswith("http://") and plain.health_credentials is None
