"""The chart ships the repository's Grafana dashboards, byte for byte, in one ConfigMap that
Grafana's dashboard sidecar finds by its label; and none when turned off."""

from __future__ import annotations

import json

from k8s_testlib import find, objects, one

from splitspec.telemetry.dashboards import DASHBOARDS


def test_the_dashboards_configmap_carries_every_dashboard_unchanged():
    cm = one(objects(), "ConfigMap", "splitspec-dashboards")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = sorted(DASHBOARDS.glob("*.json"))
    assert sorted(cm["data"]) == [f.name for f in files] and files
    for f in files:
        assert cm["data"][f.name] == f.read_text()
        assert json.loads(cm["data"][f.name])["uid"]


def test_no_dashboards_configmap_when_turned_off():
    objs = objects({"grafana": {"dashboards": {"enabled": False}}})
    assert not [o for o in find(objs, "ConfigMap") if o["metadata"]["name"].endswith("dashboards")]
