"""The product's import graph keeps its rules (tests/import_graph.py): no cycle, no service
importing another service's package, no shared package importing a service, the launcher app
imported by nothing else, every room of a service importing only in its directions, no private
name imported across rooms. Controls: crossings and wrong-way imports planted into the real
graph, a small source tree whose every kind of import statement the scanner must see, and the
lint's own command failing on a planted wrong-way import in a copy of the tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest
from import_graph import REPO, ROOMS, build, private_imports, room_of, unlisted_rooms, violations


def write_tree(root, files: dict[str, str]) -> None:
    """A small source tree: path -> text."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.fixture(scope="module")
def graph():
    return build()


def test_the_product_import_graph_keeps_its_rules(graph):
    # the graph is the real one (not empty, edges found in every package) ...
    assert {"gateway.server", "verifier_service.engine", "proposer_service.servicer",
            "splitspec.launcher.stack", "kernels.rejection", "protos.proposer_pb2"} <= set(graph)
    assert "splitspec.history_store" in graph["verifier_service.drafts.pool"]
    assert "splitspec.launcher.service" in graph["splitspec.launcher.supervisor"]
    # every room of the directions exists and holds modules
    for service, rooms in ROOMS.items():
        for room in rooms:
            assert len([m for m in graph if room_of(m) == f"{service}.{room}"]) >= 2, room
    # ... and it breaks no rule
    assert violations(graph) == []
    assert private_imports() == []
    assert unlisted_rooms() == []


@pytest.mark.parametrize("edge, expected", [
    (("verifier_service.drafts.client", "proposer_service.ahead"),
     "service imports another service: verifier_service.drafts.client -> "
     "proposer_service.ahead"),
    (("gateway.server", "verifier_service.engine"),
     "service imports another service: gateway.server -> verifier_service.engine"),
    (("kernels.rejection", "verifier_service.telemetry.metrics"),
     "shared package imports a service: kernels.rejection -> verifier_service.telemetry.metrics"),
    (("splitspec.launcher.stack", "gateway.server"),
     "shared package imports a service: splitspec.launcher.stack -> gateway.server"),
    (("splitspec.lean_llama", "splitspec.launcher.ports"),
     "the launcher app is imported: splitspec.lean_llama -> splitspec.launcher.ports"),
    (("splitspec.launcher.service", "splitspec.launcher.supervisor"),
     "cycle: splitspec.launcher.service <-> splitspec.launcher.supervisor"),
    # the rooms' directions: the cache under everything, the step under the engine, the
    # methods reached through in_target's names only, drafters apart
    (("verifier_service.kv.cache", "verifier_service.batching.output"),
     "import against the rooms' directions: verifier_service.kv.cache -> "
     "verifier_service.batching.output (verifier_service.kv may import nothing of its "
     "service)"),
    (("verifier_service.step.verify", "verifier_service.methods.eagle.head"),
     "import against the rooms' directions: verifier_service.step.verify -> "
     "verifier_service.methods.eagle.head (verifier_service.step may import "
     "verifier_service.batching, verifier_service.methods.in_target)"),
    (("verifier_service.step.executor", "verifier_service.drafts.collector"),
     "import against the rooms' directions: verifier_service.step.executor -> "
     "verifier_service.drafts.collector (verifier_service.step may import "
     "verifier_service.batching, verifier_service.methods.in_target)"),
    (("verifier_service.tp.worker", "verifier_service.servicer"),
     "import against the rooms' directions: verifier_service.tp.worker -> "
     "verifier_service.servicer (verifier_service.tp may import verifier_service.config, "
     "verifier_service.kv, verifier_service.step, verifier_service.model)"),
    (("verifier_service.config", "verifier_service.kv.cache"),
     "a shared module of the top imports a room: verifier_service.config -> "
     "verifier_service.kv.cache"),
    (("proposer_service.mlp.proposer", "proposer_service.draft.loop"),
     "import against the rooms' directions: proposer_service.mlp.proposer -> "
     "proposer_service.draft.loop (proposer_service.mlp may import proposer_service.base, "
     "proposer_service.sampling, proposer_service.tree_builder)"),
    (("proposer_service.sampling", "proposer_service.mlp.speculator"),
     "a shared module of the top imports a room: proposer_service.sampling -> "
     "proposer_service.mlp.speculator"),
    (("proposer_service.sampling", "proposer_service.servicer"),
     "a shared module of the top imports the rest of the top: proposer_service.sampling -> "
     "proposer_service.servicer"),
    (("verifier_service.methods", "verifier_service.methods.in_target"),
     "a package's __init__.py imports: verifier_service.methods -> "
     "verifier_service.methods.in_target"),
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
    write_tree(tmp_path, {name: textwrap.dedent(text) for name, text in files.items()})
    found = build(tmp_path, packages=("gateway", "verifier_service", "proposer_service",
                                      "splitspec"))
    assert violations(found) == [
        "cycle: verifier_service.engine <-> verifier_service.steps",
        "service imports another service: gateway.app -> verifier_service.engine",
        "shared package imports a service: splitspec.launcher.up -> proposer_service.server",
        "the launcher app is imported: splitspec.wire -> splitspec.launcher",
    ]


def test_the_top_may_import_every_room_and_rooms_their_rows(graph):
    planted = {m: set(targets) for m, targets in graph.items()}
    planted["verifier_service.servicer"].add("verifier_service.kv.cache")
    planted["verifier_service.tp.broadcast"].add("verifier_service.config")
    planted["verifier_service.model.target"].add("verifier_service.step.executor")
    assert violations(planted) == []


def test_a_private_name_across_rooms_is_reported(tmp_path):
    files = {
        "verifier_service/__init__.py": "",
        "verifier_service/engine.py": "from verifier_service.step.plan import _fields\n",
        "verifier_service/step/__init__.py": "",
        "verifier_service/step/plan.py": "def _fields(): pass\n",
        "verifier_service/step/executor.py": "from .plan import _fields\n",
        "verifier_service/methods/__init__.py": "",
        "verifier_service/methods/lookahead.py": "from kernels.ngram import _table\n",
        "kernels/__init__.py": "",
        "kernels/ngram.py": "_table = {}\n",
    }
    write_tree(tmp_path, files)
    assert private_imports(tmp_path, packages=("verifier_service", "kernels")) == [
        "private name imported across rooms: verifier_service.engine -> "
        "verifier_service.step.plan._fields",
        "private name imported across rooms: verifier_service.methods.lookahead -> "
        "kernels.ngram._table",
    ]


def test_the_lint_command_fails_on_a_planted_wrong_way_import(tmp_path):
    """`make lint` runs tests/import_graph.py: on a copy of the product with one import against
    the directions (the KV cache importing the engine's batching) it exits 1 and names it."""
    for package in ("gateway", "verifier_service", "proposer_service", "splitspec", "kernels",
                    "protos", "tests"):
        shutil.copytree(REPO / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "fixtures"))
    cmd = [sys.executable, str(tmp_path / "tests" / "import_graph.py")]
    clean = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    cache = tmp_path / "verifier_service" / "kv" / "cache.py"
    cache.write_text(cache.read_text() + "\n\ndef _late():\n"
                     "    from verifier_service.batching.scheduler import Scheduler\n"
                     "    return Scheduler\n")
    planted = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert planted.returncode == 1
    assert ("import against the rooms' directions: verifier_service.kv.cache -> "
            "verifier_service.batching.scheduler") in planted.stdout


def test_a_package_the_directions_do_not_list_is_reported(tmp_path):
    write_tree(tmp_path, {f"{s}/__init__.py": "" for s in ROOMS}
               | {f"verifier_service/{room}/__init__.py": "" for room in ROOMS["verifier_service"]}
               | {f"proposer_service/{room}/__init__.py": "" for room in ROOMS["proposer_service"]}
               | {"verifier_service/prefix/__init__.py": "", "verifier_service/notes/x.txt": ""})
    assert unlisted_rooms(tmp_path) == [
        "a package the directions do not list: verifier_service.prefix"]
