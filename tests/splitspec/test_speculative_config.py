"""`--speculative-config`: each of vLLM's keys becomes a flag of the service that owns the
setting; unknown keys and bad values are refused naming the key."""

from __future__ import annotations

import json

import pytest

from proposer_service.config import ProposerConfig
from splitspec.config import parse_config
from splitspec.launcher.speculative_config import (
    LOOKAHEAD_NGRAM,
    LOOKAHEAD_WINDOW,
    SpeculativeConfigError,
    SpeculativeSettings,
    lookahead_fitting,
    parse_speculative_config,
)
from verifier_service.config import VerifierConfig
from verifier_service.config_check import config_problems


def read(**config) -> SpeculativeSettings:
    return parse_speculative_config(json.dumps(config))


@pytest.mark.parametrize("method, methods", [
    ("ngram", ("ngram",)), ("draft_model", ("draft",)), ("mlp_speculator", ("mlp",)),
    ("eagle", ("eagle",)), ("eagle3", ("eagle",)), ("suffix", ("suffix",)),
    ("draft", ("draft",)), ("mlp", ("mlp",)), ("lookahead", ("lookahead",)),
    ("hybrid:suffix|ngram", ("suffix", "ngram")), ("hybrid:ngram+eagle", ("ngram", "eagle")),
])
def test_method_names_vllms_and_the_registrys(method, methods):
    assert read(method=method).methods == methods


def test_model_goes_to_the_one_model_backed_method():
    s = read(method="draft_model", model="models/draft")
    assert (s.model, s.model_method) == ("models/draft", "draft")
    assert read(method="hybrid:suffix+eagle", model="x").model_method == "eagle"


def test_num_speculative_tokens_is_the_largest_k_of_verifiers_and_proposers():
    s = read(method="ngram", num_speculative_tokens=12)
    assert s.verifier_args() == ["--max-num-speculative-tokens", "12",
                                 "--default-num-speculative-tokens", "12"]
    assert s.proposer_args("ngram") == ["--max-num-speculative-tokens", "12"]
    assert read(method="ngram").verifier_args() == []


@pytest.mark.parametrize("k", range(1, 9))
def test_a_small_k_narrows_lookaheads_window_so_the_verifier_starts(k):
    """The verifier serves lookahead whatever the method, and refuses a default window wider
    than its largest k: the flags for k pass its start-up check."""
    config = parse_config(VerifierConfig, read(method="ngram", num_speculative_tokens=k)
                          .verifier_args())
    assert config.max_num_speculative_tokens == k
    assert config_problems(config) == []


def test_the_lookahead_shape_assumed_is_the_verifiers_default():
    d = VerifierConfig()
    assert (LOOKAHEAD_WINDOW, LOOKAHEAD_NGRAM) == (d.lookahead_window, d.lookahead_ngram)
    assert lookahead_fitting(8) == []


def test_prompt_lookup_keys_are_the_ngram_proposers_match_lengths():
    s = read(method="ngram", prompt_lookup_min=2, prompt_lookup_max=5)
    config = parse_config(ProposerConfig, ["--method", "ngram", *s.proposer_args("ngram")])
    assert (config.ngram_min, config.ngram_max) == (2, 5)
    # one of them given: the other is the same, as vLLM reads it
    one = read(method="ngram", prompt_lookup_max=3)
    assert (one.ngram_min, one.ngram_max) == (3, 3)
    one = read(method="ngram", prompt_lookup_min=4)
    assert (one.ngram_min, one.ngram_max) == (4, 4)
    assert read(method="suffix").proposer_args("suffix") == []


def test_draft_tensor_parallel_size_splits_the_draft_proposer():
    s = read(method="draft_model", draft_tensor_parallel_size=2)
    config = parse_config(ProposerConfig, ["--method", "draft", *s.proposer_args("draft")])
    assert config.tensor_parallel_size == 2
    assert read(method="ngram", draft_tensor_parallel_size=1).proposer_args("ngram") == []


def test_disable_by_batch_size_is_the_gateways_queue_size_rule():
    from gateway.config import GatewayConfig

    s = read(method="ngram", disable_by_batch_size=32)
    assert parse_config(GatewayConfig, s.gateway_args()).speculative_disable_queue_size == 32
    assert read(method="ngram").gateway_args() == []


@pytest.mark.parametrize("text, names", [
    ('{"method": "ngram", "speculative_token_tree": "[]"}', "'speculative_token_tree'"),
    ('{"method": "ngram", "acceptance_method": "typical"}', "'acceptance_method'"),
    ('{"num_speculative_tokens": 3}', "'method' is required"),
    ('{"method": "medusa"}', "'medusa' is not available"),
    ('{"method": "nope"}', "unknown method 'nope'"),
    ('{"method": 3}', "'method'"),
    ('{"method": "hybrid:ngram+ngram"}', "'method'"),
    ('{"method": "ngram", "model": "models/draft"}', "'model': method 'ngram' loads no model"),
    ('{"method": "hybrid:draft+eagle", "model": "x"}', "'model'"),
    ('{"method": "draft_model", "model": ""}', "'model'"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "'num_speculative_tokens'"),
    ('{"method": "ngram", "num_speculative_tokens": "5"}', "'num_speculative_tokens'"),
    ('{"method": "ngram", "num_speculative_tokens": true}', "'num_speculative_tokens'"),
    ('{"method": "ngram", "num_speculative_tokens": 2.5}', "'num_speculative_tokens'"),
    ('{"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3}',
     "'prompt_lookup_min' 5 exceeds 'prompt_lookup_max' 3"),
    ('{"method": "suffix", "prompt_lookup_max": 3}', "'prompt_lookup_max'"),
    ('{"method": "eagle", "draft_tensor_parallel_size": 2}', "'draft_tensor_parallel_size'"),
    ('{"method": "ngram", "disable_by_batch_size": -1}', "'disable_by_batch_size'"),
    ('{"method": "ngram",}', "not valid JSON"),
    ('["ngram"]', "must be a JSON object"),
])
def test_unknown_keys_and_bad_values_are_refused_naming_them(text, names):
    with pytest.raises(SpeculativeConfigError) as err:
        parse_speculative_config(text)
    assert names in str(err.value), str(err.value)
