"""bench/load.py, load curves driven by locust: the stream reader on canned server-sent events,
each level's arithmetic (throughput, percentiles, time per output token, errors) and the goals
on made-up records, the plots, and the harness on the toy family with locust replaced by a
stand-in that streams the same requests one at a time through the real gateway (no network
beyond loopback; locust itself is the bench extra's)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from splitspec.launcher import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import load  # noqa: E402
from load_stream import parse_stream  # noqa: E402


def test_the_stream_reader_counts_text_chunks_and_takes_the_usage():
    lines = [b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}', b"",
             b'data: {"choices": [{"delta": {"content": "Hel"}}]}',
             b'data: {"choices": [{"delta": {"content": "lo"}}]}',
             b'data: {"choices": [], "usage": {"completion_tokens": 3}}', b"data: [DONE]"]
    firsts = []
    assert parse_stream(lines, lambda: firsts.append(1)) == (2, 3, None)
    assert firsts == [1]  # at the first chunk with text, once
    assert parse_stream([b'data: {"error": {"message": "boom"}}'])[2] == "{'message': 'boom'}"


def rec(start, first, end, tokens, error=None):
    return {"start": start, "first": first, "end": end, "tokens": tokens, "error": error}


def test_a_levels_throughput_percentiles_and_errors():
    lv = load.Level("concurrency", 2, [rec(0.0, 0.1, 1.1, 11), rec(0.0, 0.3, 2.3, 21),
                                       rec(1.0, None, 1.5, 0, "HTTP 500")])
    assert lv.errors == 1 and lv.throughput == pytest.approx(32 / 2.3)
    assert lv.ttft() == pytest.approx([0.1, 0.3]) and lv.tpot() == pytest.approx([0.1, 0.1])
    assert load.percentile([1, 2, 3, 4], 50) == 2 and load.percentile([1, 2, 3, 4], 99) == 4
    assert load.percentile([], 50) is None


def system(label, tput_by_c, tpot_s=0.01, errors=0):
    levels = []
    for c, tput in tput_by_c.items():  # one request of `tput` tokens in 1 s
        recs = [rec(0.0, 1.0 - tpot_s * (tput - 1), 1.0, tput)]
        recs += [rec(0.0, None, 0.5, 0, "x")] * errors
        levels.append(load.Level("concurrency", c, recs))
    return load.System(label, levels)


def test_the_goals_and_the_report_from_made_up_levels(tmp_path):
    pld = "splitspec ngram at PLD's shape (n 1-3, k=10)"
    systems = [system("splitspec off", {1: 100, 64: 400}, tpot_s=0.02),
               system(pld, {1: 200, 64: 500}),
               system(load.AUTO_LABEL, {1: 196, 64: 450}, tpot_s=0.01, errors=1)]
    lines = "\n".join(load.goals(systems, [1, 64], [pld]))
    assert "| 0 errors at 64 concurrent clients | splitspec off: 0, " in lines
    assert "splitspec auto: 1 | MISSED |" in lines
    assert "| auto's p99 TPOT at 64 no worse than off's | 10 ms against 20 ms | met |" in lines
    assert "| auto >= 0.95x the best fixed configuration at 1 | 0.98x | met |" in lines
    assert "| auto >= 0.95x the best fixed configuration at 64 | 0.90x | MISSED |" in lines
    images = load.plots(systems, tmp_path, "load")
    assert [p.name for p in images] == ["load-throughput.png", "load-tpot.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in images)


STAND_IN = textwrap.dedent('''
    """Stands in for locust: the same requests (LOAD_*), one after another, streamed."""
    import json, os, sys, time, urllib.request
    sys.path.insert(0, {bench!r})
    from load_stream import parse_stream
    host = sys.argv[sys.argv.index("--host") + 1]
    prompts = json.load(open(os.environ["LOAD_PROMPTS"]))
    for i in range(int(os.environ["LOAD_REQUESTS"])):
        body = {{"messages": prompts[i % len(prompts)], "temperature": 0.0, "stream": True,
                "max_tokens": int(os.environ["LOAD_MAX_TOKENS"]),
                "stream_options": {{"include_usage": True}},
                **json.loads(os.environ["LOAD_EXTRA"])}}
        req = urllib.request.Request(host + "/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={{"Content-Type": "application/json"}})
        r = {{"start": time.time(), "first": None}}
        with urllib.request.urlopen(req) as resp:
            chunks, tokens, error = parse_stream(resp, lambda: r.update(first=time.time()))
        r.update(end=time.time(), tokens=tokens, error=error)
        with open(os.environ["LOAD_RECORDS"], "a") as f:
            f.write(json.dumps(r) + "\\n")
''')


def test_the_toy_family_runs_the_harness(target_model_dir, tmp_path, monkeypatch):
    stand_in = tmp_path / "locust_stand_in.py"
    stand_in.write_text(STAND_IN.format(bench=str(REPO_ROOT / "bench")))
    monkeypatch.setattr(load, "locust_command", lambda args: [sys.executable, str(stand_in)])
    monkeypatch.setattr(load.peers.llama_cpp, "server_binary", lambda: None)
    out = tmp_path / "load.md"
    result = load.main(["--model", target_model_dir, "--max-chars", "300", "--per-group", "1",
                        "--concurrency", "1", "2", "--requests", "2", "--rates", "4",
                        "--rate-requests", "2", "--max-tokens", "4", "--ours", "off",
                        "--out", str(out)])
    (off, *llama) = result["systems"]
    assert off.label == "splitspec off" and all("not built" in s.skipped for s in llama)
    # every level: whole passes over the 6 questions (one per group)
    assert [(lv.kind, lv.value, len(lv.records), lv.errors) for lv in off.levels] == [
        ("concurrency", 1, 6, 0), ("concurrency", 2, 6, 0), ("rate", 4.0, 6, 0)]
    assert load.level_requests(7, 6) == 12 and load.level_requests(64, 6) == 66
    assert all(0 < r["tokens"] <= 4 and r["first"] for lv in off.levels for r in lv.records)
    report = out.read_text()
    assert "| splitspec off | 2 clients | 6 | 0 |" in report
    assert "![load-throughput](load-throughput.png)" in report
    assert (tmp_path / "load-tpot.png").exists()
