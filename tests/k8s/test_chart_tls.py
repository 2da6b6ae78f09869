"""The chart with `tls.enabled`: rendered from secrets or from cert-manager Certificates, it lints
and validates; every container's TLS flags parse and point into its role's mounted secret; each
hop allows exactly the identity the previous hop's certificate holds, and each certificate holds
the names its service is dialled at; probes never use the kubelet's plaintext gRPC probe against
a TLS port (`splitspec-health` over mutual TLS instead, whose flags parse); the committed
cpu-tls manifests equal a fresh render."""

from __future__ import annotations

import fnmatch

import helm_python as helm
import pytest
from k8s_testlib import (
    CHART,
    RENDER,
    expanded_args,
    find,
    main_container,
    objects,
    parse_service_flags,
    pod_spec,
    preset_objects,
    workloads,
)
from test_chart_matches_services import SERVICES, by_component, scripts
from test_chart_render import lint_findings, validate_strictly

from splitspec.health_probe import parser as health_parser

CERT_MANAGER = {"device": "cpu", "tls": {"enabled": True, "certManager": {"issuer": "ca"}}}
SECRETS = {"device": "cpu", "tls": {"enabled": True, "secrets": {"verifier": "my-verifier"}}}
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def parsed(objs, workload):
    entry = scripts()[main_container(workload)["command"][0]]
    return parse_service_flags(SERVICES[entry], expanded_args(objs, workload))[0]


def tls_mount(workload) -> tuple[str, str]:
    """(where the container mounts its TLS secret, that secret's name)."""
    (mount,) = [m for m in main_container(workload)["volumeMounts"] if m["name"] == "tls"]
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == "tls"]
    assert mount["readOnly"] and "subPath" not in mount  # updates must reach the files
    return mount["mountPath"], volume["secret"]["secretName"]


def covers(names: list[str], host: str) -> bool:
    return any(fnmatch.fnmatchcase(host, n) and n.count(".") == host.count(".") for n in names)


def test_the_committed_cpu_tls_manifests_equal_a_fresh_render():
    assert RENDER.stale("cpu-tls") == [], "k8s/manifests/cpu-tls is stale: run `make k8s-render`"


@pytest.mark.parametrize("values", [CERT_MANAGER, SECRETS], ids=["cert-manager", "secrets"])
def test_a_tls_release_lints_and_validates(values):
    assert lint_findings(values) == []
    objs = objects(values)
    validate_strictly(objs)
    assert bool(find(objs, "Certificate")) == (values is CERT_MANAGER)


@pytest.mark.parametrize("values", [CERT_MANAGER, SECRETS], ids=["cert-manager", "secrets"])
def test_every_container_reads_its_roles_secret(values):
    objs = objects(values)
    for w in workloads(objs):
        config = parsed(objs, w)
        role = w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        path, secret = tls_mount(w)
        expected = {"verifier": "my-verifier"}.get(role, f"splitspec-{role}-tls") \
            if values is SECRETS else f"splitspec-{role}-tls"
        assert secret == expected
        assert (config.tls_cert, config.tls_key, config.tls_ca) == (
            f"{path}/tls.crt", f"{path}/tls.key", f"{path}/ca.crt"), w["metadata"]["name"]
        for probe in PROBES:  # the kubelet's gRPC probe is plaintext: never against TLS
            assert "grpc" not in main_container(w)[probe]


def test_each_hop_allows_the_identity_the_previous_hops_certificate_holds():
    objs = objects(CERT_MANAGER)
    names = {c["metadata"]["labels"]["app.kubernetes.io/component"]: c["spec"]["dnsNames"]
             for c in find(objs, "Certificate")}
    (gateway,) = by_component(objs, "gateway")
    (verifier,) = by_component(objs, "verifier")
    gconfig, vconfig = parsed(objs, gateway), parsed(objs, verifier)
    (allowed,) = vconfig.tls_allow_peer
    assert allowed in names["gateway"]
    for w in by_component(objs, "proposer"):
        assert parsed(objs, w).tls_allow_peer == (verifier["metadata"]["name"],)
        assert verifier["metadata"]["name"] in names["verifier"]
    # every name a hop dials is one the next hop's certificate holds
    for target in gconfig.verifier:
        assert covers(names["verifier"], target.rsplit(":", 1)[0]), target
    for spec in vconfig.proposer:
        host = spec.split("=", 1)[1].rsplit(":", 1)[0]
        assert covers(names["proposer"], host), host


def test_probes_check_health_over_mutual_tls_with_the_pods_own_certificate():
    objs = objects(CERT_MANAGER)
    names = {c["metadata"]["labels"]["app.kubernetes.io/component"]: c["spec"]["dnsNames"]
             for c in find(objs, "Certificate")}
    for w in workloads(objs):
        container = main_container(w)
        config = parsed(objs, w)
        role = w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        port = getattr(config, "grpc_port", getattr(config, "port", None))
        for probe in PROBES:
            if "httpGet" in container[probe]:  # the gateway's readiness: REST /health
                assert container[probe]["httpGet"]["scheme"] == "HTTPS"
                continue
            command = container[probe]["exec"]["command"]
            assert command[0] in scripts()
            args = health_parser().parse_args(command[1:])
            assert args.port == port
            assert (args.tls_cert, args.tls_key, args.tls_ca) == (
                config.tls_cert, config.tls_key, config.tls_ca)
            assert covers(names[role], args.server_name)


def test_plaintext_front_doors_keep_the_internal_hops_mutual_tls():
    values = {**CERT_MANAGER, "tls": {**CERT_MANAGER["tls"], "frontDoor": False}}
    objs = objects(values)
    (gateway,) = by_component(objs, "gateway")
    config = parsed(objs, gateway)
    assert not config.tls_cert and config.tls_client_cert.endswith("/tls.crt") and config.tls_ca
    container = main_container(gateway)
    assert "grpc" in container["livenessProbe"]
    assert container["readinessProbe"]["httpGet"].get("scheme", "HTTP") == "HTTP"
    (verifier,) = by_component(objs, "verifier")
    assert parsed(objs, verifier).tls_cert


def test_tls_off_renders_no_tls():
    objs = preset_objects("cpu")
    assert not find(objs, "Certificate")
    for w in workloads(objs):
        assert not parsed(objs, w).tls_cert
        assert all(v["name"] != "tls" for v in pod_spec(w)["volumes"])


def test_the_values_schema_rejects_a_bad_tls_value():
    with helm.Chart.load(CHART) as chart:
        for bad, where in [({"tls": {"certManager": {"issuerKind": "Cluster"}}}, "issuerKind"),
                           ({"tls": {"mountpath": "/x"}}, "mountpath")]:
            with pytest.raises(helm.HelmValuesError, match=where):
                chart.validate_schema(bad)
