"""The EAGLE head's self-distilled data: generation resumes where it stopped, the requests are
clear of Spec-Bench and the held-out set, and the teacher-forced features are the features a
greedy generation keeps.

- shards: a rerun skips every prompt saved in any shard, shard names never collide, a half-written
  shard (a kill mid-write) is not read; planted: the resume reading the first shard only;
- overlap: a request sharing 8 consecutive words with a reference (in another case, inside longer
  text) or a short request inside a reference is dropped, unrelated ones kept; planted: n-grams
  one word longer than the check's n;
- features: scripts/eagle_features.py's one forward over prompt + answer gives the layer inputs,
  top-k labels and argmax that eagle_data.greedy_with_features kept while generating (the toy
  target); planted: each position handed the next position's features.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import eagle_data  # noqa: E402
import eagle_engine_data as eed  # noqa: E402
import eagle_features  # noqa: E402
import eagle_heldout  # noqa: E402
import eagle_prompts  # noqa: E402


def _answer(prompt: str, n: int) -> dict:
    return {"prompt": prompt, "kind": "chat", "category": "t", "prompt_ids": [1, 2, n],
            "answer_ids": [n, n + 1], "finish": "length"}


def check_resume(data: Path) -> None:
    prompts = [{"prompt": f"request {i}", "kind": "chat", "category": "t"} for i in range(10)]
    eed.write_shard(data, [_answer("request 0", 0), _answer("request 3", 3)])
    eed.write_shard(data, [_answer("request 5", 5)])
    (data / "answers" / "shard-0002.tmp").write_text("half a shard")  # a kill mid-write
    left = eed.todo(prompts, data)
    assert [p["prompt"] for p in left] == [f"request {i}" for i in (1, 2, 4, 6, 7, 8, 9)]
    third = eed.write_shard(data, [_answer("request 1", 1)])
    assert third.name == "shard-0002.jsonl.gz"
    assert [a["prompt"] for a in eed.load_answers(data)] == ["request 0", "request 3",
                                                            "request 5", "request 1"]
    assert eed.load_answers(data)[1]["answer_ids"] == [3, 4]


def test_generation_resumes_past_every_saved_answer(tmp_path):
    check_resume(tmp_path)


def test_the_resume_check_fails_when_a_shard_is_forgotten(tmp_path, monkeypatch):
    import planted_bugs as bug

    bug.eagle_data_resume_reads_first_shard_only(monkeypatch)
    with pytest.raises(AssertionError):
        check_resume(tmp_path)


REFS = ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
        "cultural experiences and must-see attractions.",
        "Translate to English: Guten Morgen.",
        "What is the capital of France?"]


def check_overlap() -> None:
    items = [{"prompt": p} for p in (
        # eight consecutive words of the first reference, inside other words
        "Please write one engaging travel blog post about a recent trip I took to Peru.",
        "What is the capital of France?",  # short: word for word inside a reference
        "Hello. Translate to English: Guten Morgen. Thanks!",  # a short reference inside
        "Write a travel blog post about a trip to the mountains in spring.",  # shares 4 words
        "Explain photosynthesis to a ten-year-old.")]
    kept, dropped = eagle_prompts.split_overlapping(items, REFS)
    assert [d["prompt"] for d in dropped] == [i["prompt"] for i in items[:3]]
    assert [k["prompt"] for k in kept] == [i["prompt"] for i in items[3:]]


def test_the_overlap_filter_drops_copies_and_keeps_the_rest():
    check_overlap()


def test_the_overlap_check_fails_with_ngrams_one_word_too_long(monkeypatch):
    import planted_bugs as bug

    bug.eagle_overlap_ngrams_one_word_longer(monkeypatch)
    with pytest.raises(AssertionError):
        check_overlap()


def test_the_templated_requests_are_broad_and_clear_of_the_heldout_set():
    items = eagle_prompts.build_prompts()
    assert len(items) > 4000 and len({i["prompt"] for i in items}) == len(items)
    assert {i["kind"] for i in items} == {"chat", "code"}
    assert len({i["category"] for i in items}) >= 10
    kept, dropped = eagle_prompts.split_overlapping(items, eagle_heldout.CHAT + eagle_heldout.CODE)
    assert len(dropped) < 20 and all(not eagle_data.overlaps(k["prompt"], eagle_heldout.CHAT)
                                     for k in kept[:300])


def check_features_match_generation() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(REPO / "models/target",
                                                 dtype=torch.float32).eval()
    layers = [1, 3, 4]
    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(2, 4096, (2, 12), generator=g)
    mask = torch.ones_like(prompts)
    tokens, feats, _, top_i, top_p = eagle_data.greedy_with_features(model, prompts, mask, 10,
                                                                     layers, 4, set())
    got = eagle_features.teacher_forced(model, [tokens[0].tolist(), tokens[1, :17].tolist()],
                                        layers, 4)
    for row, n in ((0, tokens.shape[1] - 1), (1, 16)):
        f, ti, tp, arg = got[row]
        assert f.shape == (n, 3, feats.shape[-1])
        torch.testing.assert_close(f.float(), feats[row, :n].float(), atol=2e-2, rtol=1e-2)
        assert torch.equal(ti, top_i[row, :n])
        torch.testing.assert_close(tp.float(), top_p[row, :n].float(), atol=2e-2, rtol=1e-2)
        assert torch.equal(arg[11:], tokens[row, 12:n + 1])  # the answer is the argmax chain


def test_teacher_forced_features_are_the_generations_features():
    check_features_match_generation()


def test_the_feature_check_fails_when_features_are_one_position_late(monkeypatch):
    import planted_bugs as bug

    bug.eagle_teacher_forced_features_one_position_late(monkeypatch)
    with pytest.raises(AssertionError):
        check_features_match_generation()
