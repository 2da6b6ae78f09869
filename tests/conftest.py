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


@pytest.fixture(scope="session")
def learned_models(tiny_target_dir, tmp_path_factory) -> tuple[str, str, str]:
    """(target, draft, speculator) from tiny_proposer_models.make_models, side by side in one
    directory. Built once per run (fitting the speculator takes seconds) and only read: the
    engine and integration tests with learned proposers share it."""
    from tiny_proposer_models import make_models

    return make_models(tiny_target_dir, tmp_path_factory.mktemp("learned-models"))


@pytest.fixture(scope="session")
def learned_eagle_head(learned_models, tmp_path_factory) -> str:
    """tiny_proposer_models.make_trained_eagle_head for the learned models' target (a few
    seconds of training), built once per run, only read."""
    from tiny_proposer_models import make_trained_eagle_head

    return str(make_trained_eagle_head(learned_models[0], tmp_path_factory.mktemp("eagle")))


@pytest.fixture(scope="session")
def noisy_draft_dir(tiny_target_dir, tmp_path_factory) -> str:
    """tiny_proposer_models.make_noisy_draft of the tiny target, built once per run, only read."""
    from tiny_proposer_models import make_noisy_draft

    return str(make_noisy_draft(tiny_target_dir, tmp_path_factory.mktemp("noisy-draft")))
