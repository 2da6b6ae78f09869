"""`make docs`: mkdocs builds the site from mkdocs.yml in strict mode, so a link to a page, an
anchor or a repository file that does not exist fails the build. Negative controls:
tests/docs/test_docs_site_controls.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from docs_testlib import REPO

pytest.importorskip("mkdocs", reason="mkdocs is not installed (the test extra installs it: "
                    "pip install -c constraints.txt -e '.[test]')")
pytest.importorskip("material", reason="mkdocs-material is not installed (the test extra "
                    "installs it)")


def build(site: Path, config: Path = REPO / "mkdocs.yml") -> subprocess.CompletedProcess:
    # (no --quiet: it hides the warnings that strict mode counts, and the build passes)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(config), "--site-dir", str(site)],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def build_copy(tmp_path: Path, change=None) -> subprocess.CompletedProcess:
    """Build a copy of docs/ (changed by `change`) with the repository's mkdocs.yml."""
    import shutil

    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    if change is not None:
        change(docs)
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {REPO / 'mkdocs.yml'}\ndocs_dir: {docs}\n"
                      f"hooks: [{REPO / 'scripts' / 'mkdocs_hooks.py'}]\n")
    return build(tmp_path / "site", config)


def test_the_site_builds_strict(tmp_path):
    done = build(tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    for page in ("index.html", "getting-started/index.html", "reference/metrics/index.html",
                 "api/index.html", "repo/bench/reports/specbench/index.html"):
        assert (site / page).is_file(), page


def test_every_page_is_in_the_navigation():
    import yaml

    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]

    def pages(item) -> list[str]:
        if isinstance(item, str):
            return [item]
        if isinstance(item, list):
            return [p for i in item for p in pages(i)]
        return [p for v in item.values() for p in pages(v)]

    listed = set(pages(nav))
    on_disk = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert on_disk == listed, (on_disk - listed, listed - on_disk)
