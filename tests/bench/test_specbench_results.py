"""bench/specbench.py's results file (bench/specbench_results.py), no stack started: a stopped
run's finished units are kept, --resume skips them and the report holds them, the report is
marked partial while units are missing, results taken under other settings are refused (each
with a planted-bug control), and the commit of each run is shown when they differ."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import planted_bugs as bug
import pytest

from splitspec.launcher import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

from specbench_cost import StepSplit  # noqa: E402
from specbench_data import Question  # noqa: E402
from specbench_results import (  # noqa: E402
    Results,
    ResumeRefused,
    Unit,
    definition_of,
    gather,
    settings_of,
)
from specbench_speed import Answer, Turn  # noqa: E402

QUESTIONS = [Question(1, "mt_bench", "writing", ("Write.", "Again.")),
             Question(2, "qa", "qa", ("Why?",))]


def args_of(tmp_path, *extra: str):
    import specbench

    return specbench.parse_args([
        "--model", "models/target", "--max-new-tokens", "8", "--seeded", "--no-hf",
        "--configs", "ngram", "--repeat", "none", "--out", str(tmp_path / "specbench.md"),
        *extra])


def answers(rate: float) -> list[Answer]:
    """The two questions answered at `rate` tokens per second, two tokens per step."""
    def turn(n: int) -> Turn:
        return Turn(n / rate, 0.1, tuple(range(n)), n // 2, (2,) * (n // 2), (1,) * (n // 2),
                    "ngram" if rate > 10 else "")

    return [Answer(1, "mt_bench", [turn(8), turn(6)]), Answer(2, "qa", [turn(4)])]


def unit_of(cfg, rate: float) -> Unit:
    seeded = {1: [(5, 6), (7,)], 2: [(8, 9)]}
    cost = StepSplit(9, 1.5, 1.2, 0.1, 18, {"greedy": (9, 18.0, 0.9)})
    return Unit(cfg.label, definition_of(cfg), {cfg.label: answers(rate)}, 3.0,
                {cfg.label: 2.0}, seeded=seeded, cost=cost)


FACTS = {"load average (1/5/15 min) at start": "0.10, 0.20, 0.30"}


def first_run_stopped(tmp_path) -> tuple:
    """A run that finished off, then stopped before ngram: its results file and report."""
    import specbench

    args = args_of(tmp_path)
    cfgs = specbench.select(args.configs, [])
    first = Results.open(args.results, settings_of(args, QUESTIONS),
                         {**FACTS, "commit": "aaa1111"}, resume=args.resume)
    assert specbench.plan(first, args, cfgs) == (False, cfgs)  # a fresh file: everything
    first.record("off", unit_of(cfgs[0], 10.0))
    return args, cfgs


def report_of(args, results: Results, cfgs) -> tuple[dict, str]:
    from specbench_report import write_report

    out = gather(results, [c.key for c in cfgs], args.repeat)
    out.update(questions=QUESTIONS, skipped={})
    write_report(Path(args.out), out, args, echo=False)
    return out, open(args.out).read()


def check_resume_skips_the_finished_unit(tmp_path) -> None:
    import specbench

    args, cfgs = first_run_stopped(tmp_path)
    args = args_of(tmp_path, "--resume")
    second = Results.open(args.results, settings_of(args, QUESTIONS),
                          {**FACTS, "commit": "bbb2222"}, resume=True)
    hf_todo, todo = specbench.plan(second, args, cfgs)
    assert not hf_todo and [c.key for c in todo] == ["ngram"], "off is done: only ngram runs"
    out, report = report_of(args, second, cfgs)
    assert out["pending"] == ["ngram"] and "(PARTIAL)" in report and "ngram" in report
    assert list(out["answers"]) == ["off"] and out["answers"]["off"] == answers(10.0)

    second.record("ngram", unit_of(cfgs[1], 20.0))
    out, report = report_of(args, second, cfgs)
    assert out["pending"] == [] and "PARTIAL" not in report
    assert list(out["answers"]) == ["off", "ngram k=4"]  # the file's unit and this run's
    assert out["answers"]["off"] == answers(10.0)  # exactly as measured, after the round trip
    assert out["seeded"]["off"] == unit_of(cfgs[0], 10.0).seeded
    assert out["cost"]["off"] == unit_of(cfgs[0], 10.0).cost
    assert out["wall_s"] == 6.0
    assert "| ngram k=4 | 2.00x | 2.00x | 2.00 | **2.00x** | yes |" in report
    assert "| off | 1.00x | 1.00x | 2.00 | **1.00x** | (reference) |" in report
    units = json.loads(open(args.results).read())["units"]
    assert [units[k]["commit"] for k in ("off", "ngram")] == ["aaa1111", "bbb2222"]
    assert "at 2 different commits" in report  # each row's run, with its commit
    assert any("aaa1111" in x and x.endswith("| off |") for x in report.splitlines())
    assert any("bbb2222" in x and x.endswith("| ngram k=4 |") for x in report.splitlines())


def test_resume_skips_a_finished_configuration_and_the_report_holds_it(tmp_path):
    check_resume_skips_the_finished_unit(tmp_path)


def test_resume_control_catches_a_run_that_repeats_finished_units(tmp_path, monkeypatch):
    bug.specbench_resume_runs_everything_again(monkeypatch)
    with pytest.raises(AssertionError):
        check_resume_skips_the_finished_unit(tmp_path)


def test_answers_recorded_before_policy_reasons_still_load():
    from specbench_results import answers_from_json, answers_to_json

    item = answers_to_json(answers(10.0))
    for a in item:
        for t in a["turns"]:
            del t["policy_reason"]
    assert answers_from_json(item) == answers(10.0)


def test_a_fresh_run_replaces_the_file_and_a_resumed_one_keeps_it(tmp_path):
    import specbench

    args, cfgs = first_run_stopped(tmp_path)
    fresh = Results.open(args.results, settings_of(args, QUESTIONS), FACTS, resume=False)
    assert specbench.plan(fresh, args, cfgs)[1] == cfgs
    fresh.record("ngram", unit_of(cfgs[1], 20.0))
    assert list(json.loads(open(args.results).read())["units"]) == ["ngram"]


def check_refuses_other_settings(tmp_path) -> None:
    """Every setting that changes what a unit measured: the file's are refused, naming it."""
    args, _ = first_run_stopped(tmp_path)
    for flags, name in [(("--max-new-tokens", "16"), "max_new_tokens"),
                        (("--seeded-max-new-tokens", "4"), "seeded_max_new_tokens"),
                        (("--per-group", "1"), "questions"),
                        (("--threads", "2"), "threads")]:
        other = args_of(tmp_path, "--resume", *flags)
        questions = QUESTIONS[:1] if name == "questions" else QUESTIONS
        try:
            Results.open(other.results, settings_of(other, questions), FACTS, resume=True)
        except ResumeRefused as exc:
            assert name in str(exc), exc
        else:
            raise AssertionError(f"resumed a file taken with another {name}")
    Results.open(args.results, settings_of(args, QUESTIONS), FACTS, resume=True)  # the same


def test_resume_refuses_results_taken_under_other_settings(tmp_path):
    check_refuses_other_settings(tmp_path)


def test_the_settings_control_catches_results_merged_across_settings(tmp_path, monkeypatch):
    bug.specbench_resume_ignores_settings(monkeypatch)
    with pytest.raises(AssertionError):
        check_refuses_other_settings(tmp_path)


def test_resume_refuses_a_configuration_that_now_asks_something_else(tmp_path):
    import specbench
    from specbench_configs import Config

    args, cfgs = first_run_stopped(tmp_path)
    changed = Config("off", "off", {"mode": "off", "num_speculative_tokens": 2})
    resumed = Results.open(args.results, settings_of(args, QUESTIONS), FACTS, resume=True)
    with pytest.raises(ResumeRefused, match="'off'"):
        specbench.plan(resumed, args, [changed, cfgs[1]])


def test_a_unit_without_the_repeated_pass_this_run_asks_runs_again(tmp_path):
    import specbench

    args, cfgs = first_run_stopped(tmp_path)
    again = args_of(tmp_path, "--resume", "--repeat", "off")
    resumed = Results.open(again.results, settings_of(again, QUESTIONS), FACTS, resume=True)
    assert [c.key for c in specbench.plan(resumed, again, cfgs)[1]] == ["off", "ngram"]
