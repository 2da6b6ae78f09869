# syntax=docker/dockerfile:1
# Images of splitspec: one service image per device (every console script in it; the Helm chart
# in k8s/splitspec picks the entrypoint per pod) and one image holding the shipped models.
#
#   docker build --target runtime-cpu  -t splitspec:0.1.0-cpu  .
#   docker build --target runtime-cuda -t splitspec:0.1.0-cuda .
#   docker build --target runtime-mlu  -t splitspec:0.1.0-mlu \
#       --build-arg MLU_BASE_IMAGE=<Cambricon PyTorch image with torch_mlu, pinned> .
#   docker build --target models       -t splitspec-models:0.1.0 .
#
# Services run as uid/gid 10001 with a read-only root filesystem: /tmp is the only writable
# path (the chart mounts an emptyDir there), models are mounted at /models.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
ARG BUSYBOX_IMAGE=busybox:1.37.0
# PyTorch's CPU-only wheels (the default torch wheel is a several-GB CUDA build).
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# No usable default: Cambricon's image, pinned, must be passed (the name below does not exist).
ARG MLU_BASE_IMAGE=mlu-base-image-not-set

# -- what every Python image shares ------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS python-base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --gid 10001 splitspec \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin splitspec

# The project's source, as pip installs it (no tests, models or benchmarks).
FROM scratch AS source
COPY pyproject.toml constraints.txt README.md /src/
COPY splitspec/ /src/splitspec/
COPY protos/ /src/protos/
COPY proposer_service/ /src/proposer_service/
COPY verifier_service/ /src/verifier_service/
COPY gateway/ /src/gateway/
COPY kernels/ /src/kernels/

# -- a virtualenv per torch build: torch first, then splitspec and its other dependencies -------
FROM python-base AS build-cpu
ARG TORCH_CPU_INDEX
COPY --from=source /src /src
WORKDIR /src
RUN python -m venv /opt/splitspec \
 && /opt/splitspec/bin/pip install --index-url "${TORCH_CPU_INDEX}" "torch==2.13.0" \
 && /opt/splitspec/bin/pip install -c constraints.txt .
# the CPU kernels (kernels/csrc) built here, where a compiler is: the runtime image has none
RUN apt-get update && apt-get install -y --no-install-recommends "g++=4:12.2.0-3" \
 && rm -rf /var/lib/apt/lists/* \
 && SPLITSPEC_KERNEL_CACHE=/opt/splitspec/kernels /opt/splitspec/bin/python -m kernels.cpp_build

FROM python-base AS build-cuda
COPY --from=source /src /src
WORKDIR /src
RUN python -m venv /opt/splitspec \
 && /opt/splitspec/bin/pip install -c constraints.txt .

# -- service images: what the two pip-built ones share, then one per torch build ---------------
FROM python-base AS runtime-base
ENV PATH=/opt/splitspec/bin:${PATH} HOME=/tmp HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
WORKDIR /tmp
CMD ["splitspec-gateway", "--help"]

FROM runtime-base AS runtime-cpu
COPY --from=build-cpu /opt/splitspec /opt/splitspec
ENV SPLITSPEC_KERNEL_CACHE=/opt/splitspec/kernels
USER 10001:10001

FROM runtime-base AS runtime-cuda
COPY --from=build-cuda /opt/splitspec /opt/splitspec
USER 10001:10001

# Cambricon ships torch and torch_mlu in its own images (CNToolkit and the driver's user-space
# libraries included): splitspec goes on top, keeping their torch. Pass that image, pinned by tag
# or digest, as MLU_BASE_IMAGE; without it the build stops at pulling a base that does not exist.
FROM ${MLU_BASE_IMAGE} AS runtime-mlu
COPY --from=source /src /src
WORKDIR /src
RUN python -c "import torch, torch_mlu" \
 && python -m pip install --no-cache-dir --no-deps . \
 && python -c "from importlib.metadata import requires; \
print('\n'.join(r for r in requires('splitspec') if 'extra ==' not in r and not r.startswith('torch')))" \
    > /tmp/requirements.txt \
 && python -m pip install --no-cache-dir -c constraints.txt -r /tmp/requirements.txt \
 && rm -rf /src /tmp/requirements.txt \
 && (getent group 10001 || groupadd --gid 10001 splitspec) \
 && (getent passwd 10001 || useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin splitspec)
ENV HOME=/tmp HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
USER 10001:10001
WORKDIR /tmp
CMD ["splitspec-gateway", "--help"]

# -- the shipped models, for the chart's copy-models init container (models.source: image) ------
FROM ${BUSYBOX_IMAGE} AS models
COPY --chown=10001:10001 models/target/ /models/target/
COPY --chown=10001:10001 models/draft/ /models/draft/
COPY --chown=10001:10001 models/mlp-speculator/ /models/mlp-speculator/
USER 10001:10001
CMD ["ls", "-R", "/models"]
