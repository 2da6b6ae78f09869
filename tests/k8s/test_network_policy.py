"""The NetworkPolicies select exactly the pods the chart creates and allow exactly
client -> gateway -> verifier -> proposer (plus DNS and metrics scrapes), evaluated the way
Kubernetes does: a connection needs an egress rule of the source's policy and an ingress rule of
the destination's, each naming the other end and the port."""

from __future__ import annotations

import pytest
from k8s_testlib import PRESETS, find, main_container, preset_objects, workloads

OUTSIDE = ({"app": "some-client"}, False)  # a pod in another namespace: (labels, same namespace)


def matches(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, "matchExpressions are not modelled here"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def peer_allows(peer: dict, labels: dict, same_namespace: bool) -> bool:
    if "ipBlock" in peer:
        return False  # pod-to-pod traffic is judged by selectors
    if "namespaceSelector" in peer:
        # {}: every namespace. A labelled selector is taken to match none of the test's peers.
        ns_ok = peer["namespaceSelector"] == {}
    else:
        ns_ok = same_namespace
    return ns_ok and matches(peer.get("podSelector", {}), labels)


def rule_allows(rule: dict, key: str, labels: dict, same_ns: bool, port: int) -> bool:
    ports = rule.get("ports")
    if ports is not None and not any(p["port"] == port and p.get("protocol", "TCP") == "TCP"
                                     for p in ports):
        return False
    peers = rule.get(key)
    return peers is None or any(peer_allows(p, labels, same_ns) for p in peers)


def policies_for(objs, labels: dict) -> list[dict]:
    return [p for p in find(objs, "NetworkPolicy") if matches(p["spec"]["podSelector"], labels)]


def allowed(objs, src: tuple[dict, bool], dst_labels: dict, port: int) -> bool:
    """src: (labels, whether it is in the release's namespace); dst is a pod of the release."""
    src_labels, src_in_ns = src
    if src_in_ns:
        egress = [p for p in policies_for(objs, src_labels) if "Egress" in p["spec"]["policyTypes"]]
        if egress and not any(rule_allows(r, "to", dst_labels, True, port)
                              for p in egress for r in p["spec"].get("egress", [])):
            return False
    ingress = [p for p in policies_for(objs, dst_labels) if "Ingress" in p["spec"]["policyTypes"]]
    return not ingress or any(rule_allows(r, "from", src_labels, src_in_ns, port)
                              for p in ingress for r in p["spec"].get("ingress", []))


def pods(objs) -> dict[str, tuple[dict, dict]]:
    """name -> (pod labels, {port name: port}) of every workload."""
    out = {}
    for w in workloads(objs):
        container = main_container(w)
        out[w["metadata"]["name"]] = (w["spec"]["template"]["metadata"]["labels"],
                                      {p["name"]: p["containerPort"] for p in container["ports"]})
    return out


@pytest.mark.parametrize("preset", [None, *PRESETS])
def test_every_pod_is_isolated_by_exactly_one_policy_of_its_own(preset):
    objs = preset_objects(preset)
    for name, (labels, _) in pods(objs).items():
        mine = policies_for(objs, labels)
        assert len(mine) == 1, f"{name}: {len(mine)} policies"
        assert mine[0]["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert len(find(objs, "NetworkPolicy")) == len(pods(objs))


@pytest.mark.parametrize("preset", [None, *PRESETS])
def test_only_client_to_gateway_to_verifier_to_proposer_is_allowed(preset):
    objs = preset_objects(preset)
    all_pods = pods(objs)
    role = {n: labels["app.kubernetes.io/component"] for n, (labels, _) in all_pods.items()}
    hops = {("gateway", "verifier"), ("verifier", "proposer")}
    for dst, (dst_labels, ports) in all_pods.items():
        for port_name, port in ports.items():
            if port_name == "metrics":
                continue
            # From outside the release: only the gateway's public ports.
            assert allowed(objs, OUTSIDE, dst_labels, port) == (role[dst] == "gateway"), \
                f"outside -> {dst}:{port}"
            for src, (src_labels, _) in all_pods.items():
                want = (role[src], role[dst]) in hops
                assert allowed(objs, (src_labels, True), dst_labels, port) == want, \
                    f"{src} -> {dst}:{port_name}"


@pytest.mark.parametrize("preset", [None, *PRESETS])
def test_metrics_ports_can_be_scraped_and_dns_resolved(preset):
    objs = preset_objects(preset)
    scraper = ({"app.kubernetes.io/name": "prometheus"}, False)
    kube_dns = {"k8s-app": "kube-dns"}
    for name, (labels, ports) in pods(objs).items():
        assert allowed(objs, scraper, labels, ports["metrics"]), name
        assert not allowed(objs, scraper, labels, ports["grpc"]) or \
            labels["app.kubernetes.io/component"] == "gateway", name
        (policy,) = policies_for(objs, labels)
        assert any(rule_allows(r, "to", kube_dns, False, 53) for r in policy["spec"]["egress"])
