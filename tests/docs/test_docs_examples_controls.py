"""Negative controls for the documentation examples' checks (tests/docs/test_docs_examples.py):
each passes on the page as written and fails on a planted mistake of the kind the docs had
(a method that does not exist, start-up output a release behind, a flag that is not one, a
command no test runs)."""

from __future__ import annotations

import dataclasses

import pytest
from docs_testlib import REPO, code_blocks
from test_docs_examples import (
    check_command,
    check_start_up_output,
    commands_of,
    wrong_methods,
)


def block_of(page: str, starting: str):
    """The first block of `page` whose text starts so."""
    return next(b for b in code_blocks(REPO / page) if b.body.lstrip().startswith(starting))


def planted(block, old: str, new: str):
    assert old in block.body, (block.where, old)
    return dataclasses.replace(block, body=block.body.replace(old, new))


def run_commands(block) -> None:
    for words in commands_of(block.body):
        check_command(words, block.where)


def test_a_method_that_does_not_exist_is_caught():
    block = block_of("docs/benchmarking.md", ".venv/bin/python bench/specbench.py --config")
    assert not wrong_methods([block])
    run_commands(block)
    stale = planted(block, '"method": "hybrid:suffix+eagle"', '"method": "hybrid"')
    assert wrong_methods([stale]) == [(block.where, "hybrid")]
    with pytest.raises(AssertionError):
        run_commands(stale)


def test_start_up_output_a_release_behind_is_caught():
    block = block_of("docs/observability.md", "splitspec is serving")
    check_start_up_output(block)
    last = "  metrics of proposer-suffix: http://127.0.0.1:9405/metrics\n"
    with pytest.raises(AssertionError):
        check_start_up_output(planted(block, last, ""))
    with pytest.raises(AssertionError):
        check_start_up_output(planted(block, "(proposers: ngram, draft, mlp, suffix; verifier "
                                      "replicas: 1)", "(proposers: ngram, draft, mlp)"))


def test_a_flag_that_is_not_one_is_caught():
    block = block_of("docs/getting-started.md", ".venv/bin/splitspec serve models/target")
    run_commands(block)
    with pytest.raises(AssertionError, match="does not parse"):
        run_commands(planted(block, "--speculative-config", "--speculative-configuration"))
    with pytest.raises(AssertionError, match="does not parse"):
        run_commands(planted(block, '"num_speculative_tokens": 5', '"num_speculative_tokens": "x"'))


def test_a_command_no_test_runs_must_be_marked():
    block = block_of("docs/deploy.md", "helm install splitspec k8s/splitspec -f")
    assert block.skip
    with pytest.raises(AssertionError, match="mark the block"):
        run_commands(block)
    make = block_of("docs/benchmarking.md", "make bench-quick")
    run_commands(make)
    with pytest.raises(AssertionError):
        run_commands(planted(make, "bench-quick", "bench-quik"))
