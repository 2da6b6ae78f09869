"""splitspec/launcher/ports.py through `splitspec up`'s flags: the default ports never collide,
whatever the number of verifier replicas or proposers; explicit ports are kept; a port given to
two services is refused, naming both (nothing is started: these build the stack only)."""

from __future__ import annotations

import pytest

from splitspec.launcher.cli import build_parser, main
from splitspec.launcher.config import StackConfig
from splitspec.launcher.ports import replica_ports
from splitspec.launcher.stack import Stack
from splitspec.launcher.up import stack_config
from splitspec.methods import proposer_methods


def stack(*flags: str, model: str) -> Stack:
    return Stack(stack_config(build_parser().parse_args(["up", "--model", model, *flags])))


def ports_by_service(s: Stack) -> dict[str, int]:
    return {"rest": s.config.http_port, **{svc.name: svc.port for svc in s.services},
            **{f"metrics of {n}": p for n, p in s.metrics_ports.items()}}


@pytest.mark.parametrize("replicas", [1, 2, 3, 8])
def test_default_ports_never_collide(target_model_dir, replicas):
    s = stack("--verifier-replicas", str(replicas), model=target_model_dir)
    ports = ports_by_service(s)
    assert len(set(ports.values())) == len(ports)
    assert len(s.verifiers) == replicas and s.verifier.port == 50051
    methods = proposer_methods()
    assert set(s.proposers) == set(methods)  # every proposer's default port is in the way
    assert [p.port for p in s.proposers.values()] == [m.default_port for m in methods.values()]


def test_replicas_skip_the_ports_of_any_number_of_proposers():
    proposers = set(range(50052, 50052 + 40))
    assert replica_ports(50051, 4, taken=proposers | {50050}) == [50051, 50092, 50093, 50094]
    assert replica_ports(50051, 3, given=[7000], taken=proposers) == [50051, 7000, 50092]
    assert replica_ports(50051, 1, taken=proposers) == [50051]


def test_explicit_ports_are_kept(target_model_dir):
    s = stack("--verifier-replicas", "3", "--verifier-port", "6000", "--ngram-port", "6001",
              "--grpc-port", "6003", "--http-port", "6100", model=target_model_dir)
    assert [v.port for v in s.verifiers] == [6000, 6002, 6004]
    assert s.proposers["ngram"].port == 6001 and s.gateway.port == 6003
    given = Stack(StackConfig(verifier_replicas=2, verifier_port=7000,
                              verifier_ports=[7000, 7010], metrics_port=0))
    assert [v.port for v in given.verifiers] == [7000, 7010]


@pytest.mark.parametrize("flags, message", [
    (["--ngram-port", "50050"], "port 50050 is given to two services: proposer-ngram and gateway"),
    (["--verifier-port", "8000"],
     "port 8000 is given to two services: the gateway's REST port and verifier"),
    (["--verifier-port", "50053", "--verifier-replicas", "2"],
     "port 50053 is given to two services: proposer-draft and verifier"),
    (["--metrics-port", "50050"],
     "port 50050 is given to two services: gateway and the metrics of gateway"),
])
def test_a_port_given_to_two_services_is_refused_naming_both(target_model_dir, capsys, flags,
                                                             message):
    with pytest.raises(SystemExit) as exit_:
        main(["up", "--model", target_model_dir, *flags])
    assert exit_.value.code == 2
    assert f"splitspec up: error: {message}" in capsys.readouterr().err


def test_in_target_methods_named_for_a_stack_start_no_process_and_unknown_ones_are_refused():
    config = StackConfig.with_free_ports(methods=["ngram", "lookahead"])
    assert list(config.proposers) == ["ngram"]  # every verifier serves lookahead itself
    with pytest.raises(ValueError, match="no-such-method"):
        StackConfig.with_free_ports(methods=["no-such-method"])


@pytest.mark.parametrize("flags", [["--verifier-replicas", "2"],
                                   ["--no-draft", "--no-mlp", "--no-suffix"]])
def test_services_start_in_tiers_each_after_what_it_dials(target_model_dir, flags):
    """Start-up order: every proposer, then every verifier replica (each dials the proposers),
    then the gateway (it dials the verifiers); each service exactly once."""
    s = stack(*flags, model=target_model_dir)
    tiers = s.tiers()
    assert [svc.name for t in tiers for svc in t] == [svc.name for svc in s.services]
    assert tiers == [list(s.proposers.values()), s.verifiers, [s.gateway]]


def test_no_enable_prefix_caching_reaches_every_verifier_and_proposer(target_model_dir):
    """`up --no-enable-prefix-caching` (vLLM's flag) turns reuse off where KV is kept: each
    verifier replica and the proposers (the draft model's cache) get it, and parse it."""
    from proposer_service.config import ProposerConfig
    from splitspec.config import parse_config
    from verifier_service.config import VerifierConfig

    off = stack("--no-enable-prefix-caching", "--verifier-replicas", "2", model=target_model_dir)
    for svc in [*off.verifiers, *off.proposers.values()]:
        assert "--no-enable-prefix-caching" in svc.argv, svc.name
    assert not parse_config(VerifierConfig, ["--no-enable-prefix-caching"]).enable_prefix_caching
    assert not parse_config(ProposerConfig, ["--no-enable-prefix-caching"]).enable_prefix_caching
    on = stack(model=target_model_dir)
    assert not any("prefix-caching" in a for s in on.services for a in s.argv)
