"""bench/soak.py in its short mode: concurrent greedy and seeded streams while proposers and
verifier replicas are SIGKILLed (and restarted by the supervisor) and clients cancel at random.
No request fails, every output equals its undisturbed run, no KV block leaks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from splitspec.launcher import REPO_ROOT, Stack

pytestmark = [pytest.mark.integration, pytest.mark.soak]


def test_short_soak_loses_nothing(tmp_path):
    summary = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench/soak.py"), "--short", "--json", str(summary),
         "--log-dir", str(tmp_path / "logs")],
        cwd=REPO_ROOT, env=Stack.environment(), capture_output=True, text=True, timeout=280)
    assert summary.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    r = json.loads(summary.read_text())
    assert r["failed"] == 0 and r["mismatched"] == 0, r["errors"]
    assert r["completed"] > 0 and r["checked"] == r["completed"]
    assert set(r["kv_blocks_leaked"].values()) == {0}
    kills = r["kills"]  # the faults really happened, to both kinds of service
    assert any(k.startswith("proposer-") for k in kills), kills
    assert any(k.startswith("verifier") for k in kills), kills
    assert run.returncode == 0
