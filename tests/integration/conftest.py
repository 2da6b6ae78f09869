"""A real stack (n-gram proposer, verifier, gateway) as processes on 127.0.0.1, free ports,
shared by the integration tests and always torn down; one with two verifier replicas for the
tests that kill or drain a replica; and one serving the learned proposers."""

from __future__ import annotations

import pytest

from splitspec.launcher import Stack, StackConfig


@pytest.fixture(scope="package")
def stack(target_model_dir, tmp_path_factory):
    config = StackConfig.with_free_ports(model=target_model_dir, device="cpu",
                                         log_dir=tmp_path_factory.mktemp("stack-logs"),
                                         verifier_args=["--threads", "1"])
    with Stack(config) as s:
        yield s


@pytest.fixture(scope="package")
def replicas(target_model_dir, tmp_path_factory):
    """Two verifier replicas (sharing an n-gram proposer) behind one gateway. A stream whose
    replica dies waits up to a minute for one that serves (--resume-wait-s); a draining
    replica gives its requests 30 s (--shutdown-grace-s)."""
    config = StackConfig.with_free_ports(
        model=target_model_dir, device="cpu", log_dir=tmp_path_factory.mktemp("replica-logs"),
        methods=["ngram"], verifier_replicas=2,
        verifier_args=["--threads", "1", "--shutdown-grace-s", "30"],
        gateway_args=["--resume-wait-s", "60"])
    with Stack(config) as s:
        yield s


@pytest.fixture
def replica_client(replicas):
    """A client of the `replicas` stack's gRPC front door, every replica up and idle first
    (restarted when an earlier test left it down)."""
    from learned_testlib import GenClient
    from replicas_testlib import ensure_all_serving

    client = GenClient(replicas.config.grpc_port)
    ensure_all_serving(replicas, client)
    yield client
    client.close()


@pytest.fixture(scope="package")
def learned_stack(learned_models, learned_eagle_head, tmp_path_factory):
    """The sharpened tiny target with every proposer, the learned ones included (see
    learned_testlib), and an EAGLE head in its verifier, drafting ahead pinned on: every
    losslessness test runs with drafting ahead (auto could turn it off on a busy machine, where
    it takes cores from the verifier). A test that kills one of its services restarts it before
    it ends."""
    from learned_testlib import learned_stack_config

    target, draft, spec = learned_models
    with Stack(learned_stack_config(target, draft, spec, tmp_path_factory.mktemp("learned-logs"),
                                    verifier_args=["--draft-ahead", "on"],
                                    eagle=learned_eagle_head)) as s:
        yield s
