"""docs/reference/ is what scripts/gen_reference.py writes from the code now: every command's
flags, every metric, the gRPC contract, the chart's values and the REST routes. Negative
controls: tests/docs/test_docs_reference_controls.py."""

from __future__ import annotations

from docs_testlib import DOCS, GEN_REFERENCE


def check_reference() -> None:
    stale = GEN_REFERENCE.stale_pages(DOCS / "reference")
    assert not stale, ("docs/reference is out of date; run `make reference`:\n"
                       + "\n".join(stale.values()))


def test_the_committed_reference_is_what_the_code_says():
    check_reference()


def test_every_entry_point_and_registry_is_in_the_reference():
    pages = GEN_REFERENCE.render()
    for command in ("`splitspec serve`", "`splitspec up`", "`splitspec import-gguf`",
                    "`splitspec-verifier`", "`splitspec-gateway`", "`splitspec-proposer`",
                    "`splitspec-health`"):
        assert f"## {command}" in pages["commands.md"] or f"### {command}" in pages[
            "commands.md"], command
    for metric in ("splitspec_gateway_requests_total", "splitspec_engine_step_seconds",
                   "splitspec_proposer_propose_seconds", "splitspec_kv_cache_usage_perc",
                   "splitspec_step_executor_steps_total",
                   "splitspec_proposer_eager_fallbacks_total"):
        assert f"`{metric}`" in pages["metrics.md"], metric
    for item in ("service `Generation`", "service `Verifier`", "service `Proposer`",
                 "message `SpeculationConfig`", "`seed` | `optional uint64`"):
        assert item in pages["grpc.md"], item
    assert "`tls.enabled`" in pages["helm-values.md"]
    assert "presets/tls.yaml" in pages["helm-values.md"]
    assert "## `POST /v1/chat/completions`" in pages["rest.md"]
    assert "`speculation.method`" in pages["rest.md"]


def test_a_stale_page_is_named_with_its_difference(tmp_path):
    pages = GEN_REFERENCE.render()
    for name, text in pages.items():
        (tmp_path / name).write_text(text)
    assert GEN_REFERENCE.stale_pages(tmp_path, pages) == {}
    (tmp_path / "metrics.md").write_text(pages["metrics.md"].replace(
        "splitspec_engine_step_seconds", "splitspec_engine_step_secs"))
    stale = GEN_REFERENCE.stale_pages(tmp_path, pages)
    assert list(stale) == ["metrics.md"]
    assert "+| `splitspec_engine_step_seconds`" in stale["metrics.md"]
