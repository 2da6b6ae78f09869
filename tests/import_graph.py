"""The product's import graph, read from the source with `ast` (nothing is imported), and the
rules it keeps:

- no cycle among product modules;
- a service package (gateway, verifier_service, proposer_service) imports no other service's;
- a shared package (splitspec, kernels, protos) imports no service;
- the launcher app (splitspec.launcher) is imported by nothing outside it.

Every import statement counts, wherever it stands: in a function, under TYPE_CHECKING, relative.
`python tests/import_graph.py` prints the graph's size and what breaks a rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVICES = ("gateway", "verifier_service", "proposer_service")
SHARED = ("splitspec", "kernels", "protos")
LAUNCHER = "splitspec.launcher"

Graph = dict[str, set[str]]  # module -> the product modules it imports


def module_files(root: Path, packages=SERVICES + SHARED) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the given top-level packages."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _target(name: str, modules: set[str]) -> str | None:
    """The deepest product module that `name` (a module, or a name inside one) lies in."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if (candidate := ".".join(parts[:end])) in modules:
            return candidate
    return None


def imports(module: str, path: Path, modules: set[str]) -> set[str]:
    """The product modules one file imports."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import sub` imports the submodule when there is one
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        else:
            continue
        found |= {t for n in names if (t := _target(n, modules)) and t != module}
    return found


def build(root: Path = REPO, packages=SERVICES + SHARED) -> Graph:
    files = module_files(root, packages)
    return {m: imports(m, path, set(files)) for m, path in files.items()}


def _top(module: str) -> str:
    return module.split(".")[0]


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def cycles(graph: Graph) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                on_stack.discard(w)
                component.append(w)
            on_stack.discard(v)
            if component:
                out.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def violations(graph: Graph) -> list[str]:
    """One line per broken rule (empty: the graph is clean)."""
    out = [f"cycle: {' <-> '.join(c)}" for c in cycles(graph)]
    for a in sorted(graph):
        for b in sorted(graph[a]):
            if _top(a) in SERVICES and _top(b) in SERVICES and _top(a) != _top(b):
                out.append(f"service imports another service: {a} -> {b}")
            if _top(a) in SHARED and _top(b) in SERVICES:
                out.append(f"shared package imports a service: {a} -> {b}")
            if _in(b, LAUNCHER) and not _in(a, LAUNCHER):
                out.append(f"the launcher app is imported: {a} -> {b}")
    return out


if __name__ == "__main__":
    g = build()
    found = violations(g)
    print(f"{len(g)} product modules, {sum(map(len, g.values()))} imports between them; "
          f"{len(found)} broken rules")
    print("\n".join(found) or "no cycle, no service importing another, no shared package "
          "importing a service, the launcher imported by nothing else")
