"""A real stack (n-gram proposer, verifier, gateway) as processes on 127.0.0.1, free ports,
shared by the integration tests of one module and always torn down."""

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
