"""Negative controls for the site build (tests/docs/test_docs_site.py): a copy of docs/ builds,
and fails to build strict with each planted broken link (tests/planted_bugs.py)."""

from __future__ import annotations

import planted_bugs as bug
import pytest
from test_docs_site import build_copy


def test_a_copy_of_the_docs_builds(tmp_path):
    done = build_copy(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("plant", [bug.docs_link_to_a_missing_page,
                                   bug.docs_heading_renamed_under_a_link,
                                   bug.docs_link_to_a_missing_report],
                         ids=["missing-page", "renamed-anchor", "missing-report"])
def test_the_build_fails_on_the_planted_broken_link(tmp_path, plant):
    done = build_copy(tmp_path, plant)
    assert done.returncode != 0
    assert "WARNING" in done.stdout + done.stderr
