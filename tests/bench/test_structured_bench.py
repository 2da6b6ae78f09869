"""bench/structured_bench.py's own parts: the schemas it takes (in turn from each set of the
committed subset) and its compliance check."""

from __future__ import annotations

import sys

from splitspec.launcher import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from structured_bench import SETS, complies, schemas  # noqa: E402


def test_schemas_are_taken_in_turn_from_each_set():
    got = schemas(20)
    assert len(got) == 20 and [c["set"] for c in got[:6]] == list(SETS) * 2
    assert len({c["name"] for c in got}) == 20


def test_compliance_is_valid_json_against_the_schema():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert complies('{"a":1}', schema)
    assert not complies('{"a":"x"}', schema) and not complies('{"a":1', schema)
