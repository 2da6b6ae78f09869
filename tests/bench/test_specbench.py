"""bench/specbench.py, Spec-Bench through the stack: its arithmetic against a worked example
(with planted bugs it must catch), the committed question subset, the conversation's prompts,
the loud greedy check, and the toy family running the whole harness (two questions per group, a
few tokens, one stack for every configuration)."""

from __future__ import annotations

import json
import sys

import planted_bugs as bug
import pytest

from splitspec.launcher import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
sys.path.insert(0, str(REPO_ROOT / "bench/data/spec_bench"))

import specbench_speed as speed  # noqa: E402
from specbench_data import GROUPS, QUESTIONS, ChatPrompts, load, pick  # noqa: E402
from specbench_report import mismatch_section, same_column, speedup_rows  # noqa: E402
from specbench_speed import Answer, Turn  # noqa: E402


def worked_example() -> tuple[list[Answer], list[Answer]]:
    """A configuration and its baseline on two questions, by hand:

    question 1 (MT-bench, two turns)   config: 60 tokens in 1.5 s + 40 in 0.5 s = 100 / 2.0 s
                                               = 50 tok/s (first tokens after 0.3 s and 0.1 s)
                                       base:   60 in 3.0 s + 40 in 1.0 s = 100 / 4.0 s = 25 tok/s
    question 2 (QA, one turn)          config: 30 tokens in 0.2 s = 150 tok/s (first at 0.05 s)
                                       base:   30 in 0.6 s = 50 tok/s
    Spec-Bench: mean(50, 150) / mean(25, 50) = 100 / 37.5 = 2.667x
    (a mean of per-question ratios: (2 + 3) / 2 = 2.5x; rates without the prefill: 2.907x)
    #MAT: (100 + 30) tokens over (30 + 20 + 10) steps = 2.167 (per answer, averaged: 2.5)
    first position: of 5 drafting steps, 3 accepted their first token = 0.6
    """
    def turn(tokens, seconds, ttft, steps=None, drafts=(), accepted=()):
        return Turn(seconds, ttft, tuple(range(tokens)), steps or tokens, drafts, accepted)

    config = [Answer(1, "mt_bench", [turn(60, 1.5, 0.3, 30, (3, 3, 0), (2, 0, 0)),
                                     turn(40, 0.5, 0.1, 20, (3,), (1,))]),
              Answer(2, "qa", [turn(30, 0.2, 0.05, 10, (3, 3), (0, 3))])]
    base = [Answer(1, "mt_bench", [turn(60, 3.0, 0.5), turn(40, 1.0, 0.2)]),
            Answer(2, "qa", [turn(30, 0.6, 0.1)])]
    return config, base


def check_worked_example() -> None:
    config, base = worked_example()
    assert speed.speedup(config, base) == pytest.approx(100 / 37.5)
    rows = speedup_rows({"off": base, "ngram": config}, base, ["mt_bench", "qa"])
    # the report's row: MT-bench 2.00x, QA 3.00x, #MAT, overall
    assert rows[1][:5] == ["ngram", "2.00x", "3.00x", "2.17", "**2.67x**"]
    assert speed.mean_accepted_tokens(config) == pytest.approx(130 / 60)
    assert speed.first_position_acceptance(config) == pytest.approx(3 / 5)
    assert speed.first_position_acceptance(base) is None


def test_speedup_matches_the_worked_example():
    check_worked_example()


@pytest.mark.parametrize("plant", [bug.specbench_mean_of_ratios, bug.specbench_prefill_dropped])
def test_the_worked_example_catches_a_planted_bug(monkeypatch, plant):
    plant(monkeypatch)
    with pytest.raises(AssertionError):
        check_worked_example()


def cost_example():
    """A pass of 100 engine steps between two readings, by hand:

    engine steps 100 taking 2.0 s; the waits for drafts: suffix 0.3 s, eagle 0.5 s, and the
    hybrid's own label their sum, 0.8 s (not counted again); the client waited 2.6 s for 180
    tokens. Decoding steps: 60 chains of 120 rows in 0.6 s (10 ms each, 2 rows), 30 trees of
    150 rows in 0.54 s (18 ms, 5 rows): 67% and 33%, 1.14 s together; the other 10 steps'
    (prompts) 2.0 - 0.8 - 1.14 = 0.06 s. Per step: 26 ms = drafting 8 + verify 11.4 + prefill
    0.6 + rest (2.6 - 2.0 s) 6; 1.8 tokens per step, 14.4 ms per token.
    """
    import specbench_cost as cost

    step, rt = cost.STEP, cost.ROUND_TRIP
    before = cost.CostSample({(f"{step}_count", ()): 10, (f"{step}_sum", ()): 0.5,
                              (rt, (("method", "suffix"),)): 0.1},
                             {"greedy": [5, 10, 0.05]})
    after = cost.CostSample({(f"{step}_count", ()): 110, (f"{step}_sum", ()): 2.5,
                             (rt, (("method", "suffix"),)): 0.4,
                             (rt, (("method", "eagle"),)): 0.5,
                             (rt, (("method", "hybrid:suffix+eagle"),)): 0.8},
                            {"greedy": [65, 130, 0.65], "tree": [30, 150, 0.54]})
    return cost.split(before, after, 2.6, 180, ("ngram", "suffix", "eagle"))


def check_cost_example() -> None:
    from specbench_report import cost_rows

    c = cost_example()
    assert (c.steps, c.per_step_ms, c.draft_ms) == (100, pytest.approx(26), pytest.approx(8))
    assert (c.verify_ms, c.prefill_ms, c.rest_ms) == (pytest.approx(11.4), pytest.approx(0.6),
                                                      pytest.approx(6))
    assert c.tokens_per_step == pytest.approx(1.8)
    assert c.kind("greedy") == pytest.approx((60 / 90, 2.0, 10.0))
    assert c.kind("tree") == pytest.approx((30 / 90, 5.0, 18.0)) and c.kind("sampled") is None
    assert cost_rows({"hybrid": c})[0] == ["hybrid", 100, "26.0", "8.0", "11.4", "0.6", "6.0",
                                           "1.80", "14.4", "67% / 2.0 / 10.0",
                                           "33% / 5.0 / 18.0"]


def test_the_step_cost_split_matches_the_worked_example():
    check_cost_example()


def test_the_cost_example_catches_a_hybrid_counted_twice(monkeypatch):
    """Planted: drafting summed over every round-trip label the verifier exports (a hybrid's
    own label is its components' sum: counted twice)."""
    import specbench_cost as cost

    original = cost.split

    def every_label(before, after, wall, tokens, methods):
        seen = tuple(dict(labels)["method"] for name, labels in after.metrics
                     if name == cost.ROUND_TRIP)
        return original(before, after, wall, tokens, seen)

    monkeypatch.setattr(cost, "split", every_label)
    with pytest.raises(AssertionError):
        check_cost_example()


def test_a_speedup_needs_the_same_questions():
    config, base = worked_example()
    with pytest.raises(ValueError):
        speed.speedup(config, base[:1])


def test_the_committed_questions_are_the_held_out_quarter():
    from subset import subset

    questions = load(QUESTIONS)
    assert len(questions) == 120 and all(q.question_id % 4 == 0 for q in questions)
    assert {g: sum(q.group == g for q in questions) for g in GROUPS} == dict.fromkeys(GROUPS, 20)
    assert all(len(q.turns) == (2 if q.group == "mt_bench" else 1) for q in questions)
    lines = [json.dumps({"question_id": i, "category": "qa", "turns": ["x"]}) for i in range(9)]
    assert [json.loads(x)["question_id"] for x in subset(lines)] == [0, 4, 8]


def test_pick_spreads_mt_bench_over_its_categories_and_takes_n_per_group():
    chosen = pick(load(QUESTIONS), 5)
    assert len(chosen) == 30
    mt = [q.category for q in chosen if q.group == "mt_bench"]
    assert len(set(mt)) == 5, mt
    assert len(pick(load(QUESTIONS), None)) == 120


def test_a_second_turn_holds_the_first_answer(target_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_model_dir)
    prompts = ChatPrompts(tok)
    first = prompts.ids(["Name a colour.", "Why?"], [])
    second = prompts.ids(["Name a colour.", "Why?"], ["Blue."])
    text = tok.decode(second)
    assert "Name a colour." in text and "Blue." in text and text.rstrip().endswith("assistant:")
    assert "Why?" not in tok.decode(first) and "Why?" in text
    assert len(ChatPrompts(tok, max_prompt_tokens=5).ids(["Name a colour."], [])) == 5


def test_a_greedy_answer_that_differs_from_off_is_reported_loudly():
    config, _ = worked_example()
    changed = [Answer(a.question_id, a.group, list(a.turns)) for a in config]
    t = changed[1].turns[0]
    changed[1].turns[0] = Turn(t.seconds, t.ttft, t.ids[:5] + (99,) + t.ids[6:], t.steps)
    assert same_column("ngram", config, config) == "yes"
    assert "NO: 1 of 3" in same_column("ngram", changed, config)
    lines = "\n".join(mismatch_section({"off": config, "ngram": changed}))
    assert "DIFFERS FROM OFF" in lines
    assert "question 2 (qa) turn 1: first differs at token 5" in lines


@pytest.mark.integration
def test_the_toy_family_runs_the_harness(target_model_dir, tmp_path, monkeypatch):
    """Every configuration through one stack of the toy family (two questions per group, 5
    tokens each, the seeded check's 3): every greedy answer and every seeded one equals off's;
    the report holds Spec-Bench's table against both baselines and the published rows; the
    results file holds every unit, so the same command with --resume runs nothing and renders
    the same report."""
    import specbench

    out = tmp_path / "specbench.md"
    argv = ["--model", target_model_dir, "--per-group", "2", "--max-new-tokens", "5",
            "--seeded-max-new-tokens", "3", "--max-prompt-tokens", "96", "--shared-stack",
            "--seeded", "--out", str(out)]
    result = specbench.main(argv)
    answers = result["answers"]
    assert not result["skipped"], result["skipped"]
    labels = [c.label for c in result["configs"]]
    assert set(labels) | {"HF plain", result["repeat_label"]} == set(answers)
    off = answers["off"]
    assert len(off) == 12 and sum(len(a.turns) for a in off) == 14
    for label, mine in answers.items():
        if label != "HF plain":
            assert same_column(label, mine, off) in ("yes", "(reference)"), label
    assert all(v == result["seeded"]["off"] for v in result["seeded"].values())
    assert set(result["seeded"]) == set(labels)
    seeded_lengths = {len(t) for s in result["seeded"]["off"].values() for t in s}
    assert max(seeded_lengths) == 3 and max(len(t.ids) for a in off for t in a.turns) == 5
    report = out.read_text()
    costs = result["cost"]
    assert set(costs) == set(labels)
    for label in labels:  # every configuration's steps, split: they add up
        c = costs[label]
        assert c.steps > 0 and c.draft_s >= 0 and c.wall_s >= c.step_s
        assert c.step_s >= c.draft_s + c.verify_s > 0, label
        assert (c.draft_s > 0) == (label not in ("off",)) or label == "auto", label
    for heading in ("Speed-up against Hugging Face", "Speed-up against splitspec with "
                    "speculation off", "repeated questions", "Seeded sampling",
                    "Where a step's time goes",
                    "Vicuna-7B", "every splitspec configuration is identical",
                    "until EOS or 3 new tokens (--seeded-max-new-tokens",
                    "What `auto` ran, per answer: ", "; the policy's reasons (policy_reason): "):
        assert heading in report, heading
    assert "PARTIAL" not in report and result["ran"] == ["hf", *(c.key for c in
                                                                 result["configs"])]

    def no_stack(*_):
        raise AssertionError("--resume started a stack for a unit the results file holds")

    monkeypatch.setattr(specbench.Stack, "start", no_stack)
    monkeypatch.setattr(specbench, "HfPlain", no_stack)
    resumed = specbench.main([*argv, "--resume"])
    assert resumed["ran"] == [] and resumed["answers"] == answers
    assert out.read_text() == report


def test_a_configuration_is_one_line_and_reaches_the_request():
    """A configuration from the command line (how a new kind of request, e.g. a hybrid, is added
    without editing the table) and one from the table become the SpeculationConfig sent."""
    from specbench import speculation_pb
    from specbench_configs import CONFIGS, parse_extra, select

    extra = parse_extra('tree={"mode": "on", "method": "eagle", "num_speculative_tokens": 8, '
                        '"num_branches": 4}@eagle')
    assert (extra.key, extra.methods) == ("tree", ("eagle",))
    chosen = select(["suffix", "tree"], [extra])
    assert [c.key for c in chosen] == ["off", "suffix", "tree"]  # off first: the reference
    pb = speculation_pb(extra.speculation)
    assert (pb.method, pb.num_speculative_tokens, pb.num_branches, pb.details) == (
        "eagle", 8, 4, True)
    lookahead = next(c for c in CONFIGS if c.key == "lookahead")
    assert not speculation_pb(lookahead.speculation).HasField("num_speculative_tokens")
    with pytest.raises(ValueError):
        parse_extra("broken=not json@suffix")
    with pytest.raises(ValueError):
        select(["nonesuch"], [])


def test_every_configuration_is_a_valid_request_with_a_table_safe_label():
    from specbench_configs import CONFIGS, DEFAULT

    from splitspec.methods import components_of, is_method

    for c in CONFIGS:
        assert "|" not in c.label, c.label  # a markdown table's cell separator
        method = c.speculation.get("method")
        if method is not None:
            assert is_method(method) and set(components_of(method)) <= set(c.methods), c.key
    assert {"pld", "gated", "retrieval-gated"} <= set(DEFAULT)


def test_what_auto_ran_is_counted_with_its_policy_reasons():
    from specbench_report import auto_line

    def turn(method, reason):
        return Turn(1.0, 0.1, (1, 2), 2, method=method, policy_reason=reason)

    answers = [Answer(1, "mt_bench", [turn("suffix", "goodput"), turn("", "low_acceptance")]),
               Answer(2, "qa", [turn("suffix", "goodput")])]
    assert auto_line("auto", answers) == (
        "What `auto` ran, per answer: suffix x2, off x1; the policy's reasons (policy_reason): "
        "goodput x2, low_acceptance x1.")
    old = [Answer(1, "qa", [Turn(1.0, 0.1, (1,), 1, method="ngram")])]  # no reason recorded
    assert auto_line("auto", old) == "What `auto` ran, per answer: ngram x1."
