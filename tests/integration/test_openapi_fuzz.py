"""Property-based requests (schemathesis) against the /openapi.json a live gateway serves:
valid and invalid bodies for every route, no 5xx, and every 4xx that is about the request
names its field. The gateway runs over its own verifier with a 32-token context and at most
2 prompts per request, so that every generated request is quick."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from services_testlib import on_port, start_healthy

from splitspec.launcher import Service
from splitspec.net import free_port, wait_for_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fuzzed_gateway(stack, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fuzz")
    v_port, grpc_port, http_port = free_port(), free_port(), free_port()
    verifier = Service("verifier-fuzz", [*on_port(stack.verifier.argv, v_port),
                                         "--max-model-len", "32", "--no-warmup"],
                       v_port, logs / "verifier.log")
    gateway = Service("gateway-fuzz", [
        *on_port(stack.gateway.argv, grpc_port, "--grpc-port", "--http-port", str(http_port),
                 "--verifier", f"127.0.0.1:{v_port}"), "--max-prompts", "2"],
        grpc_port, logs / "gateway.log")
    try:
        for svc in (verifier, gateway):
            start_healthy(svc, stack.config.startup_timeout_s)
        assert wait_for_port("127.0.0.1", http_port, 60)
        yield f"http://127.0.0.1:{http_port}"
    finally:
        gateway.stop()
        verifier.stop()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors_and_4xx_name_the_field(fuzzed_gateway, mode):
    schema = schemathesis.openapi.from_url(fuzzed_gateway + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 5

    @given(st.sampled_from(operations).flatmap(lambda op: op.as_strategy(mode)))
    @settings(max_examples=60, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def check(case):
        response = case.call(base_url=fuzzed_gateway, timeout=60)
        assert response.status_code < 500, (case.method, case.path, case.body, response.text)
        if 400 <= response.status_code < 500 and response.status_code != 429:
            error = response.json()["error"]
            assert error["param"] and error["message"].startswith(error["param"]), \
                (case.method, case.path, case.body, error)

    check()
