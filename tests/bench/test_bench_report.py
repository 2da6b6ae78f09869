"""bench/bench_report.py: what the comparison report says `auto` chose, from the usage each
auto request returned."""

from __future__ import annotations

import sys

from splitspec.launcher import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from bench_report import auto_choices  # noqa: E402
from compare_bench import Config, Run  # noqa: E402

from protos import common_pb2  # noqa: E402


def _run(method: str, k: int, reason: str, steps: list[int], branches: int = 1) -> Run:
    spec = common_pb2.SpeculationStats(method=method, num_speculative_tokens=k,
                                       policy_reason=reason, step_draft_tokens=steps,
                                       num_branches=branches)
    return Run(1.0, 0.1, [], [1], usage=common_pb2.Usage(speculation=spec))


def test_auto_choices_count_each_decision_and_the_drafts_that_followed():
    results = {
        Config("splitspec", "auto", 0.0): [_run("mlp", 5, "goodput", [5, 5]),
                                           _run("mlp", 5, "goodput", [4]),
                                           _run("ngram", 3, "exploration", [3, 0], branches=3),
                                           _run("", 0, "low_acceptance", [])],
        Config("splitspec", "auto", 0.8): [_run("draft", 2, "goodput", [2])],
        Config("splitspec", "mlp", 0.0, 5): [_run("mlp", 5, "requested_on", [5])],
    }
    assert auto_choices(results, 0.0) == ("mlp k=5 (goodput): 2, ngram k=3 b=3 (exploration): "
                                          "1, off (low_acceptance): 1; 3.40 draft tokens per step")
    assert auto_choices(results, 0.8) == "draft k=2 (goodput): 1; 2.00 draft tokens per step"
    assert auto_choices(results, 0.5) == ""
