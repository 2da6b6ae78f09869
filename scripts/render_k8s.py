"""Render the Helm chart (k8s/splitspec) into plain manifests, one kustomize directory per preset:

    python scripts/render_k8s.py            # (re)write k8s/manifests/{cpu,cuda,mlu,cpu-tls}/
    python scripts/render_k8s.py --check    # exit 1 when the committed manifests are stale

`make k8s-render` runs the first. Rendering uses helm-python-sdk (Helm's own Go engine through a
bundled library: no helm binary, no cluster), with release name `splitspec` and no namespace in
the objects, so `kubectl apply -k k8s/manifests/cpu` installs into the current namespace and a
kustomization on top can set another.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "k8s" / "splitspec"
MANIFESTS = REPO / "k8s" / "manifests"
PRESETS = ("cpu", "cuda", "mlu", "cuda-multihost")
# Rendered directories: each preset alone, and cpu with the TLS overlay (presets/tls.yaml)
RENDERED = {**{p: (p,) for p in PRESETS}, "cpu-tls": ("cpu", "tls")}
RELEASE = "splitspec"
HEADER = ("# Rendered from k8s/splitspec with {files} by `make k8s-render`.\n"
          "# Do not edit: change the chart and render again (a test fails when these are stale).\n")


def preset_values(preset: str | None) -> dict:
    """The values of a preset, or of a rendered directory's presets layered in order."""
    if preset is None:
        return {}
    merged: dict = {}
    for name in RENDERED.get(preset, (preset,)):
        _merge(merged, yaml.safe_load((CHART / "presets" / f"{name}.yaml").read_text()) or {})
    return merged


def _merge(into: dict, values: dict) -> None:
    """Helm's merge of a later values file: maps merge key by key, anything else replaces."""
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def render(values: dict | None = None, release: str = RELEASE,
           namespace: str | None = None) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would print it."""
    import helm_python as helm

    with helm.Chart.load(CHART) as chart:
        return chart.render(values or {}, name=release, namespace=namespace, is_install=True)


def documents(text: str) -> list[str]:
    """The non-empty YAML documents of one rendered template, stripped."""
    docs = []
    current: list[str] = []
    for line in text.splitlines() + ["---"]:
        if line.rstrip() == "---":
            doc = "\n".join(current).strip("\n")
            if yaml.safe_load(doc) if doc.strip() else None:
                docs.append(doc)
            current = []
        else:
            current.append(line.rstrip())
    return docs


def header(preset: str) -> str:
    return HEADER.format(files=" and ".join(f"presets/{p}.yaml"
                                            for p in RENDERED.get(preset, (preset,))))


def manifest_files(preset: str) -> dict[str, str]:
    """File name -> content of one preset's kustomize directory."""
    files = {}
    for path, text in sorted(render(preset_values(preset)).items()):
        if not path.endswith(".yaml"):
            continue  # NOTES.txt
        docs = documents(text)
        if docs:
            name = Path(path).name
            files[name] = header(preset) + "---\n".join(d + "\n" for d in docs)
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": sorted(files)}
    files["kustomization.yaml"] = header(preset) + yaml.safe_dump(
        kustomization, sort_keys=False)
    return files


def stale(preset: str) -> list[str]:
    """Files of a preset's directory that differ from a fresh render (or are extra/missing)."""
    want = manifest_files(preset)
    out_dir = MANIFESTS / preset
    have = {p.name: p.read_text() for p in out_dir.glob("*.yaml")} if out_dir.is_dir() else {}
    return sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))


def write(preset: str) -> None:
    out_dir = MANIFESTS / preset
    out_dir.mkdir(parents=True, exist_ok=True)
    want = manifest_files(preset)
    for old in out_dir.glob("*.yaml"):
        if old.name not in want:
            old.unlink()
    for name, text in want.items():
        (out_dir / name).write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only report stale manifests")
    args = ap.parse_args(argv)
    if args.check:
        bad = {p: stale(p) for p in RENDERED}
        for preset, names in bad.items():
            for name in names:
                print(f"stale: k8s/manifests/{preset}/{name}", file=sys.stderr)
        return 1 if any(bad.values()) else 0
    for preset in RENDERED:
        write(preset)
        print(f"wrote k8s/manifests/{preset}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
