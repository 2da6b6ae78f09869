"""Each container's OMP_NUM_THREADS (its default torch threads) is derived from its CPU limit,
else its request, as splitspec/launcher/threads.py derives a local process's: whole cores, at
least 1, and 1 for the CPU-trivial gateway and model-free proposers; a --threads flag in a
component's `flags` still reaches its service (the flag wins over the variable)."""

from __future__ import annotations

import pytest
from k8s_testlib import PRESETS, expanded_args, main_container, objects, preset_objects, workloads

from splitspec.launcher.threads import threads_for_cpus


def cpus(quantity) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def threads_env(workload: dict) -> str | None:
    env = {e["name"]: e.get("value") for e in main_container(workload).get("env", [])}
    return env.get("OMP_NUM_THREADS")


def light(workload: dict) -> bool:
    """The gateway, or a proposer that is given no model."""
    args = main_container(workload)["args"]
    component = workload["metadata"]["labels"]["app.kubernetes.io/component"]
    return component == "gateway" or (component == "proposer"
                                      and not any(a.startswith("--model=") for a in args))


@pytest.mark.parametrize("preset", [None, *PRESETS])
def test_every_container_gets_threads_from_its_cpu(preset):
    for w in workloads(preset_objects(preset)):
        res = main_container(w)["resources"]
        cpu = res.get("limits", {}).get("cpu", res.get("requests", {}).get("cpu"))
        want = 1 if light(w) else threads_for_cpus(cpus(cpu))
        assert threads_env(w) == str(want), w["metadata"]["name"]


def test_a_request_alone_a_fraction_and_a_users_flag():
    objs = objects({"verifier": {"resources": {"requests": {"cpu": "3500m"},
                                               "limits": {"cpu": None}},
                                 "flags": {"threads": 2}},
                    "proposers": {"draft": {"resources": {"limits": {"cpu": 0.5}}}}})
    by_name = {w["metadata"]["name"]: w for w in workloads(objs)}
    verifier, draft = by_name["splitspec-verifier"], by_name["splitspec-proposer-draft"]
    assert (threads_env(verifier), threads_env(draft)) == ("3", "1")
    assert "--threads=2" in expanded_args(objs, verifier)
