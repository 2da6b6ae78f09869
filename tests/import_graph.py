"""The product's import graph, read from the source with `ast` (nothing is imported), and the
rules it keeps:

- no cycle among product modules;
- a service package (gateway, verifier_service, proposer_service) imports no other service's;
- a shared package (splitspec, kernels, protos) imports no service;
- the launcher app (splitspec.launcher) is imported by nothing outside it;
- inside a service, the directions of ROOMS below: a room (a subpackage, such as
  verifier_service.kv) imports only what its row names of its own service, a shared module at
  the service's top (one that a room may import, such as verifier_service.config) imports no
  room, and the rest of the top (the servicer, the server, the engine) may import any room;
- a shared module of the top imports no other module of the top but the shared ones, a service's
  package __init__.py imports nothing, and every subpackage of a service is a room of ROOMS;
- no module imports another room's private name (one that starts with `_`).

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

# The rooms of each service, bottom up, and what each may import of its own service: a room
# ("kv"), one module of a room ("methods.in_target": that module and what lies inside it, no
# other), or a module at the service's top ("config"). Within a room imports are free. Each
# package's __init__.py says the same in words.
ROOMS: dict[str, dict[str, tuple[str, ...]]] = {
    "verifier_service": {
        "kv": (),
        "telemetry": (),
        "batching": ("kv", "telemetry"),
        "methods": ("batching",),
        "step": ("batching", "methods.in_target"),
        "model": ("config", "kv", "step", "methods.eagle.checkpoint",
                  "methods.eagle.dummy"),
        "drafts": ("batching", "telemetry", "methods.in_target"),
        "tp": ("config", "kv", "step", "model"),
        "grammar": ("methods.in_target",),
    },
    "proposer_service": {
        "telemetry": (),
        "draft": ("base", "config", "sampling", "tree_builder"),
        "mlp": ("base", "sampling", "tree_builder"),
    },
}


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


def room_of(module: str) -> str | None:
    """The room a service module lies in ("verifier_service.kv"), or None at a service's top."""
    service, _, rest = module.partition(".")
    head = rest.partition(".")[0]
    return f"{service}.{head}" if head in ROOMS.get(service, {}) else None


def _shared_top(service: str) -> set[str]:
    """The modules at a service's top that some room may import: they import no room."""
    return {f"{service}.{name}" for allowed in ROOMS[service].values() for name in allowed
            if name.partition(".")[0] not in ROOMS[service]}


def direction(a: str, b: str) -> str | None:
    """Why the import a -> b goes against its service's directions (None: it does not)."""
    service = _top(a)
    if service not in ROOMS or _top(b) != service:
        return None
    ra, rb = room_of(a), room_of(b)
    if ra is None:
        shared = _shared_top(service)
        if a in shared and rb is not None:
            return f"a shared module of the top imports a room: {a} -> {b}"
        if a in shared and b not in shared and b != service:
            # else a room would reach the whole top through the module it may import
            return f"a shared module of the top imports the rest of the top: {a} -> {b}"
        return None
    if ra == rb:
        return None
    allowed = [f"{service}.{name}" for name in ROOMS[service][ra.partition(".")[2]]]
    if any(_in(b, name) for name in allowed):
        return None
    return f"import against the rooms' directions: {a} -> {b} ({ra} may import " \
           f"{', '.join(allowed) or 'nothing of its service'})"


def private_imports(root: Path = REPO, packages=SERVICES + SHARED) -> list[str]:
    """`from m import _name` where m lies in another room (or another package) than the
    importer: one line each."""
    files = module_files(root, packages)
    modules = set(files)
    out = []
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            source = _target(base, modules)
            if source is None or source == module:
                continue
            same_room = (room_of(source) or _top(source)) == (room_of(module) or _top(module))
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") \
                        and not same_room:
                    out.append(f"private name imported across rooms: {module} -> "
                               f"{source}.{alias.name}")
    return sorted(out)


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


def unlisted_rooms(root: Path = REPO) -> list[str]:
    """A service's subpackages that ROOMS does not list (their imports would go unchecked)."""
    return [f"a package the directions do not list: {service}.{d.name}"
            for service in ROOMS for d in sorted((root / service).iterdir())
            if (d / "__init__.py").is_file() and d.name not in ROOMS[service]]


def violations(graph: Graph) -> list[str]:
    """One line per broken rule (empty: the graph is clean)."""
    out = [f"cycle: {' <-> '.join(c)}" for c in cycles(graph)]
    for a in sorted(graph):
        # importing a module runs its packages' __init__.py: they stay free of imports, so
        # that an import of one module brings nothing else along
        if (_top(a) in ROOMS and graph[a]
                and any(m.startswith(a + ".") for m in graph)):
            out.append(f"a package's __init__.py imports: {a} -> {', '.join(sorted(graph[a]))}")
        for b in sorted(graph[a]):
            if _top(a) in SERVICES and _top(b) in SERVICES and _top(a) != _top(b):
                out.append(f"service imports another service: {a} -> {b}")
            if _top(a) in SHARED and _top(b) in SERVICES:
                out.append(f"shared package imports a service: {a} -> {b}")
            if _in(b, LAUNCHER) and not _in(a, LAUNCHER):
                out.append(f"the launcher app is imported: {a} -> {b}")
            if (why := direction(a, b)) is not None:
                out.append(why)
    return out


if __name__ == "__main__":
    # `make lint` runs this: exit status 1 when a rule is broken
    g = build()
    found = violations(g) + private_imports() + unlisted_rooms()
    print(f"import directions: {len(g)} product modules, {sum(map(len, g.values()))} imports "
          f"between them; {len(found)} broken rules")
    print("\n".join(found) or "no cycle, no service importing another, no shared package "
          "importing a service, the launcher imported by nothing else, every room's imports "
          "in its direction, no private name across rooms")
    raise SystemExit(1 if found else 0)
