#!/usr/bin/env bash
# Regenerates the Python stubs in protos/ from protos/*.proto (run from anywhere).
# Usage: scripts/gen_protos.sh [OUTPUT_ROOT]   (default: the repository root)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root}
python=${PYTHON:-$root/.venv/bin/python}
cd "$root"
"$python" -m grpc_tools.protoc -I . --python_out="$out" --grpc_python_out="$out" --pyi_out="$out" protos/*.proto
