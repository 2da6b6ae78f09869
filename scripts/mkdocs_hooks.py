"""MkDocs hooks (mkdocs.yml `hooks:`): the docs link to files of the repository outside docs/
(the dated reports under bench/reports/, the model cards, the chart) with relative paths that
work where the repository is browsed. For the site, each such file that exists is added under
`repo/` (Markdown rendered as a page, anything else copied) and the links are pointed there, so
`mkdocs build --strict` still fails on a link to a file that does not exist."""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"  # where the pages live in the repository, whatever docs_dir a build reads
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
PREFIX = "repo"


def _base(source: Path, docs: Path) -> Path:
    """The folder a page's relative links start from: for a page of docs_dir, its place under
    the repository's docs/ (so that a copy of docs/ built elsewhere links the same)."""
    if docs in source.parents:
        return DOCS / source.parent.relative_to(docs)
    return source.parent


def _targets(markdown: str, source: Path, docs: Path) -> list[Path]:
    out = []
    for m in LINK.finditer(FENCE.sub("", markdown)):
        link = m[2]
        if "://" in link or link.startswith(("mailto:", "/")):
            continue
        out.append(Path(os.path.normpath(_base(source, docs) / link)))
    return out


def _site_uri(path: Path) -> str | None:
    """Where `path` is in the site: its place under docs/, `repo/<path>` for another file of the
    repository, None for anything else."""
    if DOCS in path.parents:
        return path.relative_to(DOCS).as_posix()
    if ROOT in path.parents and path.is_file():
        return f"{PREFIX}/{path.relative_to(ROOT).as_posix()}"
    return None


def on_files(files, config):
    docs = Path(config["docs_dir"]).resolve()
    queue = [Path(f.abs_src_path) for f in files.documentation_pages()]
    seen = set(queue)
    while queue:
        page = queue.pop()
        for target in _targets(page.read_text(encoding="utf-8"), page, docs):
            if target in seen or DOCS in target.parents or not target.is_file() \
                    or ROOT not in target.parents:
                continue
            seen.add(target)
            uri = _site_uri(target)
            files.append(File.generated(config, uri, abs_src_path=str(target),
                                        inclusion=InclusionLevel.NOT_IN_NAV))
            if target.suffix == ".md":
                queue.append(target)
    return files


def on_page_markdown(markdown, page, config, files):
    docs = Path(config["docs_dir"]).resolve()
    source = Path(page.file.abs_src_path)
    here = posixpath.dirname(page.file.src_uri)

    def point(m: re.Match) -> str:
        link = m[2]
        if "://" in link or link.startswith(("mailto:", "/")):
            return m[0]
        uri = _site_uri(Path(os.path.normpath(_base(source, docs) / link)))
        if uri is None:
            return m[0]
        return m[1] + posixpath.relpath(uri, here or ".") + (m[3] or "") + m[4]

    # rewrite only the text between fenced blocks
    blocks = [b.group(0) for b in FENCE.finditer(markdown)]
    text = FENCE.sub("\0", markdown).split("\0")
    out = LINK.sub(point, text[0])
    for block, rest in zip(blocks, text[1:]):
        out += block + LINK.sub(point, rest)
    return out
