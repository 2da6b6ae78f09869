"""The rendered manifests agree with the services they run: every container's command is a
console script of pyproject.toml, its flags (expanded from its ConfigMap as the kubelet does)
parse through the service's own config dataclass, and the ports those flags set are the ports
the containers declare, the probes check, the Services route to and the verifier and gateway
dial. Devices map to accelerator resources, models to the mounted volume, drain times to the
pods' grace periods; every container runs with the security defaults."""

from __future__ import annotations

import ast
import dataclasses

import pytest
import tomllib
from k8s_testlib import (
    PRESETS,
    REPO,
    expanded_args,
    find,
    main_container,
    one,
    parse_service_flags,
    pod_spec,
    port_named,
    preset_objects,
    workloads,
)

from gateway.config import GatewayConfig
from proposer_service.config import ProposerConfig
from verifier_service.config import VerifierConfig

SERVICES = {  # console script entry point -> the config dataclass its main() parses
    "gateway.server:main": GatewayConfig,
    "verifier_service.server:main": VerifierConfig,
    "proposer_service.server:main": ProposerConfig,
}
ACCELERATORS = {"cuda": "nvidia.com/gpu", "mlu": "cambricon.com/mlu"}
CASES = [None, *PRESETS]


def scripts() -> dict[str, str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def parsed(objs, workload):
    """(config, metrics port) of a workload's container."""
    entry = scripts()[main_container(workload)["command"][0]]
    return parse_service_flags(SERVICES[entry], expanded_args(objs, workload))


def by_component(objs, component: str) -> list[dict]:
    return [w for w in workloads(objs)
            if w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
            == component]


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def grpc_probe_ports(container: dict) -> set[int]:
    return {container[p]["grpc"]["port"] for p in ("startupProbe", "readinessProbe",
                                                    "livenessProbe") if "grpc" in container[p]}


def stop_grace_s(path: str) -> float:
    """The grace a service's serve() gives gRPC calls on SIGTERM: `server.stop(grace=...)`, a
    literal or a field of its config (then the field's default)."""
    for node in ast.walk(ast.parse((REPO / path).read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "stop":
            for kw in node.keywords:
                if kw.arg == "grace" and isinstance(kw.value, ast.Constant):
                    return float(kw.value.value)
                if kw.arg == "grace" and isinstance(kw.value, ast.Attribute):
                    return kw.value.attr  # type: ignore[return-value]
    raise AssertionError(f"no server.stop(grace=...) in {path}")


@pytest.mark.parametrize("preset", CASES)
def test_every_container_runs_a_console_script_whose_flags_parse(preset):
    objs = preset_objects(preset)
    assert {c for c in (main_container(w)["command"][0] for w in workloads(objs))} == \
        {"splitspec-gateway", "splitspec-verifier", "splitspec-proposer"}
    for w in workloads(objs):
        command = main_container(w)["command"]
        assert len(command) == 1 and scripts()[command[0]] in SERVICES
        config, _ = parsed(objs, w)  # argparse exits on an unknown flag or a bad value
        assert config.host == "0.0.0.0"


@pytest.mark.parametrize("preset", CASES)
def test_ports_probes_and_services_match_the_flags(preset):
    objs = preset_objects(preset)
    services = find(objs, "Service")
    for w in workloads(objs):
        container = main_container(w)
        config, metrics_port = parsed(objs, w)
        labels = w["spec"]["template"]["metadata"]["labels"]
        if isinstance(config, GatewayConfig):
            grpc_ports = {config.grpc_port}
            assert port_named(container, "http") == config.http_port
            ready = container["readinessProbe"]["httpGet"]
            assert ready["path"] == "/health" and ready["port"] == "http"
        else:
            grpc_ports = {config.port}
        assert port_named(container, "grpc") in grpc_ports
        assert grpc_probe_ports(container) <= grpc_ports and grpc_probe_ports(container)
        # The metrics port the service opens is the one declared, annotated and scraped.
        annotations = w["spec"]["template"]["metadata"]["annotations"]
        assert metrics_port == port_named(container, "metrics")
        assert annotations["prometheus.io/scrape"] == "true"
        assert int(annotations["prometheus.io/port"]) == metrics_port
        # Each Service of the component routes to ports this container declares.
        mine = [s for s in services if selects(s["spec"]["selector"], labels)]
        assert mine, f"no Service selects {w['metadata']['name']}"
        declared = {p["name"] for p in container["ports"]}
        for svc in mine:
            for p in svc["spec"]["ports"]:
                assert p["targetPort"] in declared


@pytest.mark.parametrize("preset", CASES)
def test_the_verifier_dials_every_proposer_pool_through_its_headless_service(preset):
    objs = preset_objects(preset)
    (verifier,) = by_component(objs, "verifier")
    vconfig, _ = parsed(objs, verifier)
    pools = {}
    for w in by_component(objs, "proposer"):
        config, _ = parsed(objs, w)
        pools[config.method] = (w, config)
    targets = dict(p.split("=", 1) for p in vconfig.proposer)
    assert set(targets) == set(pools)
    for method, target in targets.items():
        host, port = target.rsplit(":", 1)
        svc = one(objs, "Service", host)
        # Headless: the name resolves to every ready pod, which the verifier's pool balances over.
        assert svc["spec"]["clusterIP"] == "None"
        pool, config = pools[method]
        assert selects(svc["spec"]["selector"], pool["spec"]["template"]["metadata"]["labels"])
        assert not any(selects(svc["spec"]["selector"], o["spec"]["template"]["metadata"]["labels"])
                       for o in workloads(objs) if o is not pool)
        # Pod addresses bypass the Service's port mapping: the port dialled is the pod's.
        assert int(port) == config.port == port_named(main_container(pool), "grpc")


@pytest.mark.parametrize("preset", CASES)
def test_the_gateway_routes_to_every_verifier_replica_by_its_stable_name(preset):
    objs = preset_objects(preset)
    (gateway,) = by_component(objs, "gateway")
    (verifier,) = by_component(objs, "verifier")
    gconfig, _ = parsed(objs, gateway)
    vconfig, _ = parsed(objs, verifier)
    sts, svc_name = verifier["metadata"]["name"], verifier["spec"]["serviceName"]
    assert one(objs, "Service", svc_name)["spec"]["clusterIP"] == "None"
    assert list(gconfig.verifier) == [f"{sts}-{i}.{svc_name}:{vconfig.port}"
                                      for i in range(verifier["spec"]["replicas"])]


@pytest.mark.parametrize("preset", CASES)
def test_devices_images_and_models_match(preset):
    objs = preset_objects(preset)
    for w in workloads(objs):
        container = main_container(w)
        config, _ = parsed(objs, w)
        device = getattr(config, "device", "cpu")
        limits = container["resources"]["limits"]
        accelerators = {r for r in ACCELERATORS.values() if r in limits}
        if device in ACCELERATORS:
            assert accelerators == {ACCELERATORS[device]} and limits[ACCELERATORS[device]] >= 1
        else:
            assert not accelerators
        assert container["image"].endswith(f"-{device}")  # runtime-<device> image
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        for field in ("model", "tokenizer"):
            path = getattr(config, field, "")
            if path:
                assert path.startswith(mounts["models"] + "/")
                assert (REPO / "models" / path.removeprefix(mounts["models"] + "/")).is_dir()
    (verifier,) = by_component(objs, "verifier")
    assert parsed(objs, verifier)[0].device == (preset or "mlu")


@pytest.mark.parametrize("preset", CASES)
def test_grace_periods_cover_prestop_and_the_services_drain(preset):
    objs = preset_objects(preset)

    def budget(w) -> tuple[int, int]:
        spec = pod_spec(w)
        pre_stop = int(main_container(w)["lifecycle"]["preStop"]["exec"]["command"][1])
        return spec["terminationGracePeriodSeconds"], pre_stop

    (verifier,) = by_component(objs, "verifier")
    vgrace, vpre = budget(verifier)
    vdrain = parsed(objs, verifier)[0].shutdown_grace_s
    assert stop_grace_s("verifier_service/server.py") == "shutdown_grace_s"
    assert vgrace >= vpre + vdrain + 5
    # Verifier startup covers model load: at least five minutes before the kubelet gives up.
    startup = main_container(verifier)["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    proposer_drain = stop_grace_s("proposer_service/server.py")
    for w in by_component(objs, "proposer"):
        grace, pre = budget(w)
        drain = proposer_drain if isinstance(proposer_drain, float) else \
            getattr(parsed(objs, w)[0], proposer_drain)
        assert grace >= pre + drain + 5
    (gateway,) = by_component(objs, "gateway")
    grace, pre = budget(gateway)
    assert grace >= pre + vdrain  # it relays the streams the verifier drains


@pytest.mark.parametrize("preset", CASES)
def test_every_pod_runs_with_the_security_defaults(preset):
    objs = preset_objects(preset)
    for w in workloads(objs):
        spec = pod_spec(w)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec["automountServiceAccountToken"] is False
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), (c["name"], kind)
        # The only writable paths are volumes.
        writable = {m["mountPath"] for m in main_container(w)["volumeMounts"]
                    if not m.get("readOnly")}
        assert writable == {"/tmp"}


def test_service_config_dataclasses_are_what_the_chart_assumes():
    """Guards the assumptions above: the fields the chart sets exist under these names."""
    fields = {cls: {f.name for f in dataclasses.fields(cls)} for cls in SERVICES.values()}
    assert {"host", "http_port", "grpc_port", "verifier"} <= fields[GatewayConfig]
    assert {"host", "port", "model", "device", "dtype", "proposer",
            "shutdown_grace_s"} <= fields[VerifierConfig]
    assert {"method", "host", "port", "model", "tokenizer", "device"} <= fields[ProposerConfig]
