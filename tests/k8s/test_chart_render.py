"""The chart lints clean and renders for every preset with helm-python-sdk (Helm's engine, no
helm binary, no cluster); every rendered object validates strictly against the Kubernetes
schemas of kubernetes-validate, for the oldest and newest Kubernetes the chart supports; and the
committed plain manifests in k8s/manifests are exactly a fresh render."""

from __future__ import annotations

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from k8s_testlib import CHART, PRESETS, RENDER, objects, preset_objects

KUBE_VERSIONS = ("1.27.0", "1.37.0")  # Chart.yaml kubeVersion >=1.27; the newest schemas here
# Custom resources kubernetes-validate has no schema for: their fields are checked by hand.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"),
                ("gateway.networking.k8s.io/v1", "HTTPRoute"),
                ("cert-manager.io/v1", "Certificate")}
CERTIFICATE_USAGES = {"digital signature", "key encipherment", "server auth", "client auth"}
EVERYTHING_ON = {
    "gateway": {"ingress": {"enabled": True, "className": "nginx",
                            "tls": [{"hosts": ["splitspec.example.com"],
                                     "secretName": "splitspec-tls"}]},
                "httpRoute": {"enabled": True, "hostnames": ["splitspec.example.com"],
                              "parentRefs": [{"name": "public", "namespace": "gateways"}]},
                "autoscaling": {"enabled": False}},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
    "otel": {"enabled": True, "resourceAttributes": {"deployment.environment": "test"}},
    "models": {"source": "pvc", "pvc": {"claimName": "splitspec-models"}},
    "networkPolicy": {"gatewayFrom": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "ingress"}}}]},
    "verifier": {"replicas": 3},
}


def lint_findings(values: dict | None) -> list[dict]:
    result = helm.lint(CHART, values, strict=True, kube_version="1.27.0")
    # The only finding allowed is INFO (severity 1) "icon is recommended": no hosted icon.
    return result["errors"] + [m for m in result["messages"]
                               if (m["severity"], m["error"]) != (1, "icon is recommended")]


@pytest.mark.parametrize("preset", [None, *PRESETS])
def test_the_chart_lints_clean(preset):
    assert lint_findings(RENDER.preset_values(preset)) == []


def test_the_chart_lints_clean_with_every_option_on():
    assert lint_findings(EVERYTHING_ON) == []


def test_the_values_schema_rejects_typos_and_bad_values():
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema({})
        for bad, where in [({"verifier": {"prot": 1}}, "prot"),
                           ({"proposers": {"ngram": {"replicas": -1}}}, "replicas"),
                           ({"models": {"source": "s3"}}, "source"),
                           ({"gateway": {"httpPort": 70000}}, "httpPort")]:
            with pytest.raises(helm.HelmValuesError, match=where):
                chart.validate_schema(bad)


def test_the_chart_refuses_an_unknown_device_and_a_flag_it_owns():
    with pytest.raises(helm.HelmRenderError, match='unknown device "tpu"'):
        RENDER.render({"device": "tpu"})
    with pytest.raises(helm.HelmRenderError, match="verifier.flags: --port is set by the chart"):
        RENDER.render({"verifier": {"flags": {"port": 1}}})


def validate_strictly(objs: list[dict]) -> None:
    for obj in objs:
        key = (obj["apiVersion"], obj["kind"])
        if key in CUSTOM_KINDS:
            check_custom(obj)
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(map(str, exc.path))
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on {version}: "
                            f"{path}: {exc.message}")


def check_custom(obj: dict) -> None:
    """The fields of the custom resources the chart renders, by their published definitions."""
    spec = obj["spec"]
    if obj["kind"] == "ServiceMonitor":
        assert set(spec) == {"selector", "endpoints"}
        assert spec["selector"]["matchLabels"]
        for ep in spec["endpoints"]:
            assert set(ep) <= {"port", "path", "interval"} and ep["port"] == "metrics"
    elif obj["kind"] == "Certificate":
        assert set(spec) <= {"secretName", "commonName", "dnsNames", "duration", "renewBefore",
                             "privateKey", "usages", "issuerRef"}
        assert spec["secretName"] and spec["dnsNames"] and set(spec["usages"]) <= \
            CERTIFICATE_USAGES
        assert set(spec["issuerRef"]) == {"name", "kind", "group"}
        assert spec["issuerRef"]["kind"] in ("Issuer", "ClusterIssuer")
        assert set(spec["privateKey"]) <= {"algorithm", "size", "rotationPolicy", "encoding"}
    else:  # HTTPRoute
        assert set(spec) <= {"parentRefs", "hostnames", "rules"}
        assert all("name" in ref for ref in spec["parentRefs"])
        for rule in spec["rules"]:
            assert set(rule) <= {"matches", "backendRefs"}
            assert all(set(b) == {"name", "port"} for b in rule["backendRefs"])


@pytest.mark.parametrize("preset", [None, *PRESETS])
def test_every_rendered_object_validates_strictly(preset):
    objs = preset_objects(preset)
    expected = {"Deployment", "StatefulSet", "Service", "ConfigMap", "NetworkPolicy",
                "ServiceAccount"}
    if preset != "cpu":  # the cpu preset runs one gateway, no autoscaler
        expected.add("HorizontalPodAutoscaler")
    assert expected <= {o["kind"] for o in objs}
    validate_strictly(objs)


def test_every_object_validates_strictly_with_every_option_on():
    objs = objects(EVERYTHING_ON)
    kinds = {o["kind"] for o in objs}
    assert {"Ingress", "HTTPRoute", "ServiceMonitor"} <= kinds
    validate_strictly(objs)


def test_strict_validation_catches_a_misplaced_field():
    """The validator is really strict: an unknown field in a pod spec fails it."""
    deployment = next(o for o in preset_objects("cpu") if o["kind"] == "Deployment")
    bad = yaml.safe_load(yaml.safe_dump(deployment))
    bad["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSIONS[0], strict=True)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_committed_plain_manifests_equal_a_fresh_render(preset):
    stale = RENDER.stale(preset)
    assert not stale, (f"k8s/manifests/{preset} is stale ({', '.join(stale)}): "
                       f"run `make k8s-render`")


def test_a_stale_manifest_is_detected(tmp_path, monkeypatch):
    import shutil

    shutil.copytree(RENDER.MANIFESTS, tmp_path / "manifests")
    monkeypatch.setattr(RENDER, "MANIFESTS", tmp_path / "manifests")
    assert RENDER.stale("cpu") == []
    path = tmp_path / "manifests" / "cpu" / "verifier.yaml"
    path.write_text(path.read_text().replace("replicas: 1", "replicas: 2"))
    (tmp_path / "manifests" / "cpu" / "extra.yaml").write_text("{}\n")
    assert RENDER.stale("cpu") == ["extra.yaml", "verifier.yaml"]
    assert RENDER.main(["--check"]) == 1
