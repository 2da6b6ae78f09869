"""Helpers for the chart tests: render the chart (helm-python-sdk, offline) for a preset, parse the
objects, and read a container's flags the way the kubelet and the service would."""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "k8s" / "splitspec"
PRESETS = ("cpu", "cuda", "mlu")


def render_script():
    spec = importlib.util.spec_from_file_location("render_k8s_under_test",
                                                  REPO / "scripts" / "render_k8s.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


RENDER = render_script()


def objects(values: dict | None = None) -> list[dict]:
    """Every object a release renders with these values (chart defaults underneath)."""
    out = []
    for path, text in sorted(RENDER.render(values or {}).items()):
        if path.endswith(".yaml"):
            out.extend(d for d in yaml.safe_load_all(text) if d)
    return out


@functools.lru_cache(maxsize=None)
def _preset_objects(preset: str | None) -> tuple:
    return tuple(objects(RENDER.preset_values(preset)))


def preset_objects(preset: str | None) -> list[dict]:
    """Cached: the objects of a preset (None: the chart's defaults). Do not modify them."""
    return list(_preset_objects(preset))


def find(objs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objs
            if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict], kind: str, name: str) -> dict:
    found = find(objs, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def workloads(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def main_container(workload: dict) -> dict:
    (container,) = pod_spec(workload)["containers"]
    return container


def expanded_args(objs: list[dict], workload: dict) -> list[str]:
    """The container's args with $(VAR) expanded from its ConfigMaps and env, as the kubelet
    does; fails on a reference to a variable that is not defined."""
    container = main_container(workload)
    env = {}
    for source in container.get("envFrom", []):
        env.update(one(objs, "ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})

    def expand(match: re.Match) -> str:
        assert match.group(1) in env, f"$({match.group(1)}) is not defined"
        return env[match.group(1)]

    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", expand, a) for a in container["args"]]


def parse_service_flags(config_cls, argv: list[str]) -> tuple[object, int]:
    """(the service's config, its metrics port) parsed exactly as the service's main() does:
    through the telemetry flags when the services take them, else the config dataclass alone."""
    try:
        from splitspec.telemetry.config import parse_service_config
    except ImportError:
        from splitspec.config import parse_config

        return parse_config(config_cls, argv), 0
    config, telemetry = parse_service_config(config_cls, argv, 0)
    return config, telemetry.metrics_port


def port_named(container: dict, name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert name in ports, f"container {container['name']} has no port named {name}"
    return ports[name]
