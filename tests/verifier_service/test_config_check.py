"""The verifier's start-up check: every configuration it accepts serves every valid request that
leans on its defaults (k, lookahead's shape), and an inconsistent one is refused with one line
naming the flags."""

from __future__ import annotations

import dataclasses
import itertools

import planted_bugs as bug
import pytest

from splitspec.errors import StartupError
from splitspec.params import SpeculationMode, SpeculationRequest, resolve_speculation
from verifier_service.config import VerifierConfig
from verifier_service.config_check import check_config, config_problems
from verifier_service.methods.lookahead import LookaheadMethod

SERVED = ("ngram", "lookahead")


def grid() -> list[VerifierConfig]:
    """Configurations around the limits: k limits, default k and lookahead shapes."""
    return [VerifierConfig(max_num_speculative_tokens=max_k, default_num_speculative_tokens=k,
                           lookahead_window=w, lookahead_ngram=n, lookahead_guesses=g)
            for max_k, k, w, n, g in itertools.product((1, 4, 8, 16), (0, 4, 8), (1, 3, 8, 15),
                                                       (2, 3, 5), (0, 2))]


def check_accepted_configurations_serve_default_requests(configs) -> int:
    """Every accepted configuration takes every valid request that uses its defaults, the way
    its engine checks one on arrival (k within its limit, lookahead's window within its node
    limit); returns how many were accepted."""
    accepted = 0
    for c in configs:
        if config_problems(c):
            continue
        accepted += 1
        method = LookaheadMethod.from_verifier(0, c)
        for req in (SpeculationRequest(method="lookahead"),
                    SpeculationRequest(SpeculationMode.ON, "lookahead"),
                    SpeculationRequest(SpeculationMode.ON, "ngram")):
            plan = resolve_speculation(req, SERVED, c.default_num_speculative_tokens)
            assert plan.k <= c.max_num_speculative_tokens, c
            if plan.method == "lookahead":
                method.check_plan(plan, c.max_num_speculative_tokens)
    return accepted


def test_every_accepted_configuration_serves_requests_on_its_defaults():
    assert check_accepted_configurations_serve_default_requests(grid()) > 50


def test_the_check_catches_a_start_up_check_that_forgets_lookahead(monkeypatch):
    bug.verifier_accepts_any_lookahead_default(monkeypatch)
    with pytest.raises(Exception, match="speculation.lookahead.window"):
        check_accepted_configurations_serve_default_requests(grid())


def test_the_reported_configuration_is_refused_with_one_line_naming_its_flags():
    c = VerifierConfig(lookahead_window=15, lookahead_ngram=5, max_num_speculative_tokens=16)
    with pytest.raises(StartupError) as exc:
        check_config(c)
    line = str(exc.value)
    assert "\n" not in line
    for words in ("--lookahead-window 15", "--lookahead-ngram 5", "60 draft nodes",
                  "--max-num-speculative-tokens 16"):
        assert words in line


@pytest.mark.parametrize("change,words", [
    ({"default_num_speculative_tokens": 9}, "--default-num-speculative-tokens 9 exceeds"),
    ({"max_num_speculative_tokens": 0}, "--max-num-speculative-tokens 0 must be >= 1"),
    ({"lookahead_window": 0}, "--lookahead-window 0 must be in [1, 16]"),
    ({"lookahead_ngram": 9}, "--lookahead-ngram 9 must be in [2, 8]"),
    ({"max_num_branches": 0}, "--max-num-branches 0 must be >= 1"),
    ({"block_size": 0}, "--block-size 0 must be >= 1"),
])
def test_each_inconsistency_is_named(change, words):
    with pytest.raises(StartupError, match="inconsistent configuration") as exc:
        check_config(dataclasses.replace(VerifierConfig(), **change))
    assert words in str(exc.value)


def test_the_defaults_pass():
    check_config(VerifierConfig())


def test_the_default_node_limit_holds_lookaheads_window_and_one_guess():
    """Lookahead's default shape (W 3, N 3, G 2) needs 10 nodes whole; the default limit (8)
    holds its window and one pool guess, which is what it accepts: on held-out code (toy
    family, bench/hybrid_steps.py --configs lookahead --max-k 10, 3 prompts x 48 tokens) the
    window alone (k 6) made 1.04 tokens per step, one guess (k 8) 1.67, both guesses (k 10)
    1.73. A limit that dropped the guess would take lookahead back to no speed-up."""
    from splitspec.params import lookahead_window_nodes

    c = VerifierConfig()
    one_guess = lookahead_window_nodes(c.lookahead_window, c.lookahead_ngram) + (
        c.lookahead_ngram - 1)
    assert c.lookahead_guesses >= 1 and one_guess <= c.max_num_speculative_tokens
