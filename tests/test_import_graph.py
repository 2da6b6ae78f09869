"""The product's import graph keeps its rules (tests/import_graph.py): no cycle, no service
importing another service's package, no shared package importing a service, the launcher app
imported by nothing else. Controls: crossings planted into the real graph, and a small source
tree whose every kind of import statement the scanner must see, are reported."""

from __future__ import annotations

import textwrap

import pytest
from import_graph import build, violations


@pytest.fixture(scope="module")
def graph():
    return build()


def test_the_product_import_graph_keeps_its_rules(graph):
    # the graph is the real one (not empty, edges found in every package) ...
    assert {"gateway.server", "verifier_service.engine", "proposer_service.servicer",
            "splitspec.launcher.stack", "kernels.rejection", "protos.proposer_pb2"} <= set(graph)
    assert "splitspec.history_store" in graph["verifier_service.proposer_pool"]
    assert "splitspec.launcher.service" in graph["splitspec.launcher.supervisor"]
    # ... and it breaks no rule
    assert violations(graph) == []


@pytest.mark.parametrize("edge, expected", [
    (("verifier_service.proposer_client", "proposer_service.ahead"),
     "service imports another service: verifier_service.proposer_client -> "
     "proposer_service.ahead"),
    (("gateway.server", "verifier_service.engine"),
     "service imports another service: gateway.server -> verifier_service.engine"),
    (("kernels.rejection", "verifier_service.metrics"),
     "shared package imports a service: kernels.rejection -> verifier_service.metrics"),
    (("splitspec.launcher.stack", "gateway.server"),
     "shared package imports a service: splitspec.launcher.stack -> gateway.server"),
    (("splitspec.lean_llama", "splitspec.launcher.ports"),
     "the launcher app is imported: splitspec.lean_llama -> splitspec.launcher.ports"),
    (("splitspec.launcher.service", "splitspec.launcher.supervisor"),
     "cycle: splitspec.launcher.service <-> splitspec.launcher.supervisor"),
])
def test_a_planted_crossing_is_reported(graph, edge, expected):
    planted = {m: set(targets) for m, targets in graph.items()}
    planted[edge[0]].add(edge[1])
    assert violations(planted) == [expected]


def test_the_scanner_sees_imports_in_functions_under_type_checking_and_relative(tmp_path):
    files = {
        "gateway/__init__.py": "",
        "gateway/app.py": "def late():\n    import verifier_service.engine\n",
        "verifier_service/__init__.py": "",
        "verifier_service/engine.py": "from . import steps\n",
        "verifier_service/steps.py": "from typing import TYPE_CHECKING\n"
                                     "if TYPE_CHECKING:\n    from .engine import Engine\n",
        "proposer_service/__init__.py": "",
        "proposer_service/server.py": "",
        "splitspec/__init__.py": "",
        "splitspec/wire.py": "from splitspec import launcher\n",
        "splitspec/launcher/__init__.py": "",
        "splitspec/launcher/up.py": "from proposer_service.server import main\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    found = build(tmp_path, packages=("gateway", "verifier_service", "proposer_service",
                                      "splitspec"))
    assert violations(found) == [
        "cycle: verifier_service.engine <-> verifier_service.steps",
        "service imports another service: gateway.app -> verifier_service.engine",
        "shared package imports a service: splitspec.launcher.up -> proposer_service.server",
        "the launcher app is imported: splitspec.wire -> splitspec.launcher",
    ]
