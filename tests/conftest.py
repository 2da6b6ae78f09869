"""Shared fixtures: the model directories the suite runs against, and offline settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# The CPU has no Triton backend: kernels run in Triton's interpreter. Set before anything
# (transformers included) imports triton, which reads it at import time.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Service processes started by tests inherit this: on 2 shared cores, 1 thread each is fastest.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def target_model_dir() -> str:
    from splitspec.config import DEFAULT_MODEL

    return str(REPO_ROOT / DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tiny_target_dir() -> str:
    """tests/fixtures/tiny-llama: a random tiny Llama for tests that build their own proposers."""
    from tiny_proposer_models import TINY_TARGET

    return TINY_TARGET
