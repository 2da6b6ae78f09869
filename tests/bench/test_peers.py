"""bench/peers.py, the engines a user would run instead: the harness end to end on the toy
family with llama-server not built (a stub that fails if anything tries to start or convert
for it), and its arithmetic (tokens per step from llama-server's timings, the flags a built
llama-server lacks, the goals' ratios) on made-up rows."""

from __future__ import annotations

import sys

import pytest

from splitspec.launcher import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import peers  # noqa: E402
from specbench_data import Question  # noqa: E402


def test_the_toy_family_runs_the_harness_without_llama_server(target_model_dir, tmp_path,
                                                              monkeypatch):
    def not_built(*_, **__):
        raise AssertionError("llama-server was used although it is not built")

    monkeypatch.setattr(peers.llama_cpp, "server_binary", lambda: None)
    monkeypatch.setattr(peers.llama_cpp, "f16_gguf", not_built)
    monkeypatch.setattr(peers.LlamaServer, "__enter__", not_built)
    out = tmp_path / "peers.md"
    result = peers.main(["--model", target_model_dir, "--per-group", "1", "--max-new-tokens",
                         "4", "--max-chars", "300", "--ours", "off", "pld", "auto",
                         "--auto-methods", "ngram", "--shared-stack", "--out", str(out)])
    rows = {r.label: r for r in result["rows"]}
    assert all("not built" in rows[c.label].skipped for c in peers.LLAMA)
    measured = [label for label, r in rows.items() if r.answers]
    assert measured == [peers.HF, peers.OFF, "splitspec ngram at PLD's shape (n 1-3, k=10)",
                        "splitspec auto"]
    off = rows[peers.OFF]
    assert len(off.answers) == 6 and sum(len(t) for t in off.answers.values()) == 7
    assert all(0 < t.tokens <= 4 for ts in off.answers.values() for t in ts)
    for label in measured[2:]:  # greedy through one stack: the same text as off
        assert peers.agreement(rows[label], off) == "7/7", label
    report = out.read_text()
    assert report == result["report"]
    for text in ("| splitspec auto |", "llama-server not built", "## Goals",
                 "auto >= 0.95x the best fixed configuration, MT-bench", "not measured"):
        assert text in report, text


def reply(seconds: float, tokens: int, text: str = "t", steps: int | None = None):
    return peers.Reply(seconds, tokens, text, steps)


def test_tokens_per_step_from_llama_servers_timings_and_the_projects_usage():
    llama = {"usage": {"completion_tokens": 30},
             "timings": {"predicted_n": 30, "draft_n": 24, "draft_n_accepted": 18}}
    assert peers.steps_of(llama, 30) == 12  # 18 accepted drafts + 12 tokens of its own
    assert peers.steps_of({"usage": {"speculation": {"steps": 9}}}, 30) == 9
    assert peers.steps_of({"usage": {}}, 30) is None


def test_a_configuration_this_llama_server_lacks_is_named():
    help_text = ("-md, --model-draft FNAME\n--spec-draft-n-max N\n"
                 "--spec-type none,draft-simple,ngram-cache")
    draft_k2 = next(c for c in peers.LLAMA if c.key == "draft-k2")
    assert peers.unsupported(draft_k2, help_text) is None
    ngram_simple = next(c for c in peers.LLAMA if c.key == "ngram-simple")
    assert peers.unsupported(ngram_simple, help_text) == "--spec-type ngram-simple"
    pld = next(c for c in peers.LLAMA if c.key == "ngram-pld")
    assert peers.unsupported(pld, help_text + " ngram-simple") == "--spec-ngram-simple-size-n"


def test_the_goals_are_ratios_of_measured_speeds():
    qs = [Question(1, "qa", "qa", ("q",)), Question(2, "rag", "rag", ("q",))]

    def row(label, qa_s, rag_s):  # 100 tokens per answer
        return peers.Row(label, {1: [reply(qa_s, 100)], 2: [reply(rag_s, 100)]})

    rows = [row(peers.LLAMA_PLAIN, 1.0, 1.0), row("llama-server draft (defaults)", 0.5, 0.5),
            row(peers.OFF, 1.0, 1.25), row("splitspec ngram k=4", 0.5, 0.25),
            row("splitspec auto", 0.5, 0.5)]
    lines = "\n".join(peers.goals(rows, qs, ["qa", "rag"]))
    # best ours: ngram, 200 tokens / 0.75 s = 266.7 tok/s; llama's best: 200 / 1 s
    assert "(splitspec ngram k=4) >= 1.2x llama-server's best speculative " in lines
    assert "| 1.33x | met |" in lines
    assert "off >= 0.9x llama-server plain at equal threads | 0.89x | MISSED |" in lines
    assert "the best fixed configuration, QA (splitspec ngram k=4) | 1.00x | met |" in lines
    assert "the best fixed configuration, RAG (splitspec ngram k=4) | 0.50x | MISSED |" in lines
    report = peers.render(rows, qs, type("A", (), {"max_new_tokens": 4, "threads": 1})(), "x")
    assert "| splitspec ngram k=4 | 200.0 | 400.0 | 266.7 | 2.67x | 3.00x |" in report


@pytest.mark.parametrize("label", [peers.LLAMA_PLAIN, peers.OFF])
def test_agreement_counts_identical_texts(label):
    a = peers.Row(label, {1: [reply(1, 1, "x"), reply(1, 1, "y")]})
    b = peers.Row("b", {1: [reply(1, 1, "x "), reply(1, 1, "z")]})
    assert peers.agreement(b, a) == "1/2" and peers.agreement(a, a) == "(reference)"
