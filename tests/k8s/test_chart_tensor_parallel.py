"""Tensor parallelism in the chart: `verifier.tensorParallelSize: 2` asks for two accelerators
per verifier pod, passes --tensor-parallel-size 2 (parsed by the verifier's own config) and
mounts a memory-backed /dev/shm; the cuda-multihost preset renders each replica as a
LeaderWorkerSet group (leader: rank 0's host, serving gRPC where the gateway dials; workers: the
other ranks), whose ranks may reach each other, and validates like the rest (built-in kinds
strictly, the LeaderWorkerSet by its published fields); its plain manifests are committed."""

from __future__ import annotations

import pytest
from k8s_testlib import (
    RENDER,
    expanded_args,
    find,
    main_container,
    objects,
    one,
    parse_service_flags,
    pod_spec,
)
from test_chart_render import KUBE_VERSIONS, validate_strictly

from verifier_service.config import VerifierConfig

TP2 = {"device": "cuda", "verifier": {"tensorParallelSize": 2}}
LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
# what the LeaderWorkerSet controller sets in every pod of a group (here: group 0's leader)
LWS_ENV = {"LWS_LEADER_ADDRESS": "splitspec-verifier-0.splitspec-verifier.default",
           "LWS_WORKER_INDEX": "1"}


def test_tensor_parallel_size_2_asks_for_two_devices_and_passes_the_flag():
    objs = objects(TP2)
    verifier = one(objs, "StatefulSet", "splitspec-verifier")
    container = main_container(verifier)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    config, _ = parse_service_flags(VerifierConfig, expanded_args(objs, verifier))
    assert config.tensor_parallel_size == 2 and config.tensor_parallel_nodes == 1
    shm = next(v for v in pod_spec(verifier)["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    validate_strictly(objs)


def test_one_device_renders_as_before():
    verifier = one(objects({"device": "cuda"}), "StatefulSet", "splitspec-verifier")
    assert main_container(verifier)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert all(v["name"] != "dshm" for v in pod_spec(verifier)["volumes"])
    assert not any("tensor-parallel" in a for a in main_container(verifier)["args"])


def test_a_size_the_hosts_do_not_divide_is_refused():
    import helm_python as helm

    with pytest.raises(helm.HelmRenderError, match="not a multiple of"):
        RENDER.render({"verifier": {"tensorParallelSize": 3,
                                    "leaderWorkerSet": {"enabled": True, "hosts": 2,
                                                        "port": 29500}}})


def _expand(objs, template: dict) -> list[str]:
    """A group pod's args as the kubelet expands them (LWS_* as the controller sets them)."""
    import re

    args = expanded_args(objs, {"spec": {"template": {
        "spec": {**template["spec"], "containers": [
            {**template["spec"]["containers"][0],
             "args": [re.sub(r"\$\((LWS_[A-Z_]+)\)", lambda m: LWS_ENV[m.group(1)], a)
                      for a in template["spec"]["containers"][0]["args"]]}]}}}})
    return args


def test_the_multihost_preset_renders_a_leader_worker_set_group_per_replica():
    objs = objects(RENDER.preset_values("cuda-multihost"))
    assert not find(objs, "StatefulSet") and not find(objs, "Service", "splitspec-verifier")
    (lws,) = [o for o in objs if (o["apiVersion"], o["kind"]) == LWS]
    spec = lws["spec"]
    assert set(spec) == {"replicas", "startupPolicy", "leaderWorkerTemplate"}
    group = spec["leaderWorkerTemplate"]
    assert set(group) == {"size", "restartPolicy", "leaderTemplate", "workerTemplate"}
    assert group["size"] == 2 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = group["leaderTemplate"], group["workerTemplate"]
    lead_cfg, _ = parse_service_flags(VerifierConfig, _expand(objs, leader))
    work_cfg, _ = parse_service_flags(VerifierConfig, _expand(objs, worker))
    for cfg in (lead_cfg, work_cfg):
        assert (cfg.tensor_parallel_size, cfg.tensor_parallel_nodes) == (8, 2)
        assert cfg.tensor_parallel_address == LWS_ENV["LWS_LEADER_ADDRESS"] + ":29500"
    assert (lead_cfg.tensor_parallel_node_rank, work_cfg.tensor_parallel_node_rank) == (0, 1)
    for template in (leader, worker):
        limits = template["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == 4  # 8 ranks over 2 hosts
    # the leader serves (probes, gRPC port the gateway dials as <name>-<i>.<name>); workers don't
    assert "readinessProbe" in leader["spec"]["containers"][0]
    assert "readinessProbe" not in worker["spec"]["containers"][0]
    gateway = one(objs, "Deployment", "splitspec-gateway")
    assert "--verifier=splitspec-verifier-0.splitspec-verifier:50051" in expanded_args(
        objs, gateway)
    # every built-in object validates strictly; the group's pod templates as pods
    validate_strictly([o for o in objs if (o["apiVersion"], o["kind"]) != LWS])
    import kubernetes_validate

    for template in (leader, worker):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": template["spec"]}
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(pod, version, strict=True)


def test_the_ranks_of_a_group_may_reach_each_other():
    objs = objects(RENDER.preset_values("cuda-multihost"))
    policy = one(objs, "NetworkPolicy", "splitspec-verifier")["spec"]
    verifier = {"matchLabels": policy["podSelector"]["matchLabels"]}
    assert {"from": [{"podSelector": verifier}]} in policy["ingress"]
    assert {"to": [{"podSelector": verifier}]} in policy["egress"]
    single = one(objects(TP2), "NetworkPolicy", "splitspec-verifier")["spec"]
    assert {"from": [{"podSelector": verifier}]} not in single["ingress"]


def test_the_committed_multihost_manifests_equal_a_fresh_render():
    assert RENDER.stale("cuda-multihost") == []
