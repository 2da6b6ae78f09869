#!/usr/bin/env bash
# The Python packages the stack needs that a GPU machine's image may lack, downloaded here as
# wheels into .whl/ (git-ignored) for Python 3.12 on x86-64 Linux, at the versions the suite is
# tested with (constraints.txt; grpcio and protobuf at the versions the committed stubs were
# generated with). On the GPU machine, before `make bench-gpu`:
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#     export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pin() { grep -i "^$1==" constraints.txt | head -1; }
names=(starlette uvicorn grpcio grpcio-health-checking grpcio-reflection protobuf gguf
       opentelemetry-api opentelemetry-sdk opentelemetry-proto
       opentelemetry-exporter-otlp-proto-common opentelemetry-exporter-otlp-proto-grpc
       opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-otlp-common
       opentelemetry-exporter-http-transport opentelemetry-semantic-conventions
       opentelemetry-instrumentation opentelemetry-instrumentation-grpc)
specs=()
for n in "${names[@]}"; do specs+=("$(pin "$n")"); done
# what those need beyond the image (pinned as this virtualenv has them)
for n in googleapis-common-protos wrapt; do
    specs+=("$(.venv/bin/python -m pip freeze 2>/dev/null | grep -i "^$n==" || echo "$n")")
done
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
for spec in "${specs[@]}"; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 --platform any -d .whl "$spec"
done
ls .whl
