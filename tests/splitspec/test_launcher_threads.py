"""splitspec/launcher/threads.py: the default threads of each process of a local stack, on
worked examples, and the stack handing them to its services (nothing is started)."""

from __future__ import annotations

import pytest

from splitspec.launcher.config import StackConfig
from splitspec.launcher.stack import Stack
from splitspec.launcher.threads import (
    DRAFTER,
    LIGHT,
    THREADS_ENV,
    VERIFIER,
    plan_threads,
    threads_for_cpus,
)

DEFAULT_STACK = {"verifier": VERIFIER, "proposer-draft": DRAFTER, "proposer-mlp": DRAFTER,
                 "proposer-ngram": LIGHT, "proposer-suffix": LIGHT, "gateway": LIGHT}


def test_two_cores_the_verifier_gets_both_and_everything_else_one():
    assert plan_threads(2, DEFAULT_STACK) == {
        "verifier": 2, "proposer-draft": 1, "proposer-mlp": 1, "proposer-ngram": 1,
        "proposer-suffix": 1, "gateway": 1}


def test_replicas_and_ranks_split_the_cores_and_a_drafter_never_outgrows_a_verifier():
    two = {**DEFAULT_STACK, "verifier-2": VERIFIER}
    assert plan_threads(16, two) == {**plan_threads(16, DEFAULT_STACK), "verifier": 8,
                                     "verifier-2": 8, "proposer-draft": 4, "proposer-mlp": 4}
    assert plan_threads(16, two, ranks_per_verifier=4) == {
        **plan_threads(16, DEFAULT_STACK), "verifier": 2, "verifier-2": 2,
        "proposer-draft": 2, "proposer-mlp": 2}
    assert set(plan_threads(1, two).values()) == {1}


def test_whole_cores_only():
    assert [threads_for_cpus(c) for c in (0.25, 1, 1.5, 2, 7.9)] == [1, 1, 1, 2, 7]
    with pytest.raises(ValueError, match="unknown role"):
        plan_threads(2, {"verifier": "target"})


def test_the_stack_sets_each_service_its_threads_unless_the_environment_does(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    config = StackConfig.with_free_ports(models={"draft": "d"}, methods=["draft", "ngram"],
                                         cores=8)
    stack = Stack(config)
    assert {s.name: s.env.get(THREADS_ENV) for s in stack.services} == {
        "verifier": "8", "proposer-draft": "2", "proposer-ngram": "1", "gateway": "1"}
    monkeypatch.setenv(THREADS_ENV, "3")
    assert all(THREADS_ENV not in s.env for s in Stack(config).services)
