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


def built_once(tmp_path_factory, name: str, build):
    """build(directory) -> result, run once per test run: under pytest-xdist the workers share
    the run's base directory, so the first worker builds (the others wait on a file lock) and
    the rest read what it wrote (build must be deterministic and return only paths under its
    directory). Without workers, this process's temporary directory."""
    import json

    from filelock import FileLock

    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent  # this run's, shared by its workers
    done = root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            out = root / name
            out.mkdir(exist_ok=True)  # a worker whose build failed may have left it
            done.write_text(json.dumps(build(out)))
    got = json.loads(done.read_text())
    return tuple(got) if isinstance(got, list) else got


@pytest.fixture(scope="session")
def learned_models(tiny_target_dir, tmp_path_factory) -> tuple[str, str, str]:
    """(target, draft, speculator) from tiny_proposer_models.make_models, side by side in one
    directory. Built once per run (fitting the speculator takes seconds) and only read: the
    engine and integration tests with learned proposers share it."""
    from tiny_proposer_models import make_models

    return built_once(tmp_path_factory, "learned-models",
                      lambda out: make_models(tiny_target_dir, out))


@pytest.fixture(scope="session")
def learned_eagle_head(learned_models, tmp_path_factory) -> str:
    """tiny_proposer_models.make_trained_eagle_head for the learned models' target (a few
    seconds of training), built once per run, only read."""
    from tiny_proposer_models import make_trained_eagle_head

    return built_once(tmp_path_factory, "eagle",
                      lambda out: str(make_trained_eagle_head(learned_models[0], out)))


@pytest.fixture(scope="session")
def noisy_draft_dir(tiny_target_dir, tmp_path_factory) -> str:
    """tiny_proposer_models.make_noisy_draft of the tiny target, built once per run, only read."""
    from tiny_proposer_models import make_noisy_draft

    return built_once(tmp_path_factory, "noisy-draft",
                      lambda out: str(make_noisy_draft(tiny_target_dir, out)))
