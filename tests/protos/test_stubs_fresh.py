"""The generated stubs in protos/ are committed; this fails when they are stale.

Regenerate with `make protos` after editing a .proto file.
"""

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_match_the_protos(tmp_path):
    subprocess.run(["bash", str(ROOT / "scripts/gen_protos.sh"), str(tmp_path)], check=True,
                   env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    generated = sorted((tmp_path / "protos").iterdir())
    assert generated, "protoc generated nothing"
    for path in generated:
        committed = ROOT / "protos" / path.name
        assert committed.exists(), f"{committed} is missing: run `make protos`"
        assert filecmp.cmp(path, committed, shallow=False), \
            f"{committed} is stale: run `make protos`"


def test_services_live_in_the_splitspec_v1_package():
    from protos import generation_pb2, proposer_pb2, verifier_pb2

    names = {s.full_name for m in (generation_pb2, proposer_pb2, verifier_pb2)
             for s in m.DESCRIPTOR.services_by_name.values()}
    assert names == {"splitspec.v1.Generation", "splitspec.v1.Proposer", "splitspec.v1.Verifier"}
