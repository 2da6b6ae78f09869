import pytest

from splitspec.errors import InvalidArgument
from splitspec.params import (
    SamplingParams,
    SpeculationMode,
    SpeculationRequest,
    StoppingCriteria,
    resolve_speculation,
)


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(min_p=2.0), "min_p"),
    (dict(seed=-1), "seed"),
])
def test_sampling_errors_name_the_field(kwargs, field):
    with pytest.raises(InvalidArgument) as e:
        SamplingParams(**kwargs).validate()
    assert e.value.field == field and e.value.message.startswith(field)


def test_stopping_rejects_zero_max_tokens_and_empty_stop():
    with pytest.raises(InvalidArgument, match="max_tokens"):
        StoppingCriteria(max_tokens=0).validate()
    with pytest.raises(InvalidArgument, match="stop"):
        StoppingCriteria(stop=("",)).validate()


def test_speculation_method_and_k_limits():
    with pytest.raises(InvalidArgument, match="speculation.method.*unknown"):
        SpeculationRequest(method="medusa").validate(("ngram",), 8)
    with pytest.raises(InvalidArgument, match="not served"):
        SpeculationRequest(method="draft").validate(("ngram",), 8)
    with pytest.raises(InvalidArgument, match="num_speculative_tokens.*<= 8"):
        SpeculationRequest(num_speculative_tokens=9).validate(("ngram",), 8)


def test_resolve_speculation_defaults_and_off():
    on = resolve_speculation(SpeculationRequest(mode=SpeculationMode.ON), ("ngram",), 4)
    assert (on.method, on.k, on.enabled) == ("ngram", 4, True)
    off = resolve_speculation(SpeculationRequest(mode=SpeculationMode.OFF), ("ngram",), 4)
    assert not off.enabled
    zero = resolve_speculation(SpeculationRequest(num_speculative_tokens=0), ("ngram",), 4)
    assert not zero.enabled
    auto = resolve_speculation(SpeculationRequest(details=True), ("ngram",), 4)
    assert (auto.method, auto.k, auto.adaptive, auto.details) == ("ngram", 4, False, True)
    with pytest.raises(InvalidArgument, match="speculation.mode"):
        resolve_speculation(SpeculationRequest(mode=SpeculationMode.ON), (), 4)


@pytest.mark.parametrize("salt, ok", [(None, True), ("", True), ("t" * 256, True),
                                      ("t" * 257, False), (7, False), (["a"], False)])
def test_a_cache_salt_is_a_string_of_at_most_256_characters(salt, ok):
    from splitspec.params import check_cache_salt

    if ok:
        check_cache_salt("cache_salt", salt)
    else:
        with pytest.raises(InvalidArgument, match="cache_salt"):
            check_cache_salt("cache_salt", salt)


@pytest.mark.parametrize("method, why", [
    ("hybrid:ngram", "2 to 3 distinct"),
    ("hybrid:ngram+ngram", "2 to 3 distinct"),
    ("hybrid:ngram+suffix+draft+mlp", "2 to 3 distinct"),
    ("hybrid:ngram+medusa", "unknown component 'medusa'"),
    ("hybrid:ngram+lookahead", "own shape"),
    ("hybrid:", "2 to 3 distinct"),
    # a gated hybrid's earlier tiers are deterministic proposers: the gate reads no sampled draw
    ("hybrid:eagle|ngram", "'eagle' cannot gate"),
    ("hybrid:draft|eagle", "'draft' cannot gate"),
    ("hybrid:ngram+mlp|eagle", "'mlp' cannot gate"),
    ("hybrid:ngram|ngram", "2 to 3 distinct"),
    ("hybrid:ngram|", "unknown component ''"),
    ("hybrid:grammar|eagle", "'grammar' cannot gate"),
])
def test_bad_hybrids_name_the_method_field(method, why):
    with pytest.raises(InvalidArgument) as e:
        SpeculationRequest(method=method).validate()
    assert e.value.field == "speculation.method" and why in str(e.value)


def test_gated_hybrids_name_their_tiers():
    from splitspec.methods import hybrid_components, hybrid_tiers, is_gated, step_kind_of

    for ok in ("hybrid:suffix|eagle", "hybrid:ngram+suffix|eagle", "hybrid:ngram|suffix|draft",
               "hybrid:ngram+suffix"):
        SpeculationRequest(method=ok).validate(("ngram", "suffix", "eagle", "draft"))
    assert hybrid_tiers("hybrid:ngram+suffix|eagle") == (("ngram", "suffix"), ("eagle",))
    assert hybrid_components("hybrid:ngram+suffix|eagle") == ("ngram", "suffix", "eagle")
    assert is_gated("hybrid:suffix|eagle") and not is_gated("hybrid:suffix+eagle")
    assert hybrid_tiers("eagle") is None and not is_gated("eagle")
    # one method's draft a step: chains; a tier that merges: trees
    assert step_kind_of("hybrid:suffix|eagle", True) == step_kind_of("eagle", True)
    assert step_kind_of("hybrid:ngram+suffix|eagle", True) == step_kind_of("eagle", True, 2)
    with pytest.raises(InvalidArgument, match="not served"):
        SpeculationRequest(method="hybrid:suffix|eagle").validate(("suffix",))


def test_a_hybrid_is_served_where_every_component_is():
    req = SpeculationRequest(method="hybrid:suffix+eagle")
    req.validate(("suffix", "eagle", "ngram"))
    with pytest.raises(InvalidArgument) as e:
        req.validate(("suffix", "ngram"))
    assert e.value.field == "speculation.method" and "not served" in str(e.value)
