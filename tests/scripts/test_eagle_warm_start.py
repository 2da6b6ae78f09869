"""Training the shipped EAGLE head further, and the go/no-go that decides whether the result
replaces it.

- warm start: a saved head taken up by eagle_fit (its draft vocabulary from d2t, fc unfolded from
  this run's feature scale) gives back exactly the stored tensors; planted: fc taken as stored,
  the scale folded in twice;
- mix: with --code-weight W a code answer is drawn W times as often as a chat answer (the drawn
  share matches the expected one); planted: the weight ignored;
- go/no-go: the candidate wins only when it is better on every kind on both measures; planted:
  a verdict that takes either measure.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests" / "verifier_service"))

import eagle_fit  # noqa: E402
import eagle_gonogo  # noqa: E402
from eagle_testlib import HEAD_DIM, HEADS, INTER, KV, VOCAB, H  # noqa: E402

from verifier_service.methods.eagle.checkpoint import EagleSpec, save_eagle3  # noqa: E402


def check_warm_start(tmp_path: Path) -> None:
    spec = EagleSpec(3, H, HEADS, KV, HEAD_DIM, INTER, VOCAB, 48, H, aux_layer_ids=(0, 1, 2))
    g = torch.Generator().manual_seed(9)
    target = {"embed": torch.randn(VOCAB, H, generator=g), "head": torch.randn(VOCAB, H,
                                                                              generator=g),
              "norm": torch.ones(H)}
    ids = sorted(torch.randperm(VOCAB, generator=g)[:48].tolist())
    d2t, t2d, _ = eagle_fit.draft_maps(ids, VOCAB)
    first = eagle_fit.HeadParams(spec, target, ids, torch.rand(3 * H, generator=g) + 0.5)
    with torch.no_grad():
        for p in first.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    save_eagle3(tmp_path / "head", spec, first.weights(d2t, t2d))
    _, stored, got_ids, vocab = eagle_fit.load_init(tmp_path / "head")
    assert got_ids == ids and vocab["draft_vocab_size"] == 48
    # this run's features scale differently: fc must be unfolded with this run's scale
    second = eagle_fit.HeadParams(spec, target, got_ids, torch.rand(3 * H, generator=g) * 4 + 0.1)
    second.start_from(stored)
    again = second.weights(d2t, t2d)
    for name in eagle_fit.PARAMS:
        torch.testing.assert_close(getattr(again, name).float(), getattr(stored, name).float(),
                                   atol=1e-3, rtol=1e-3)


def test_a_stored_head_is_taken_up_as_it_was(tmp_path):
    check_warm_start(tmp_path)


def test_the_warm_start_check_fails_when_fc_is_not_unfolded(tmp_path, monkeypatch):
    import planted_bugs as bug

    bug.eagle_warm_start_fc_not_unfolded(monkeypatch)
    with pytest.raises(AssertionError):
        check_warm_start(tmp_path)


def check_code_weight() -> None:
    records = [{"kind": "code", "i": i} for i in range(30)] + [{"kind": "chat", "i": i}
                                                              for i in range(70)]
    weights = eagle_fit.kind_weights(records, 3.0)
    want = 3 * 30 / (3 * 30 + 70)
    assert eagle_fit.expected_share(records, weights, "code") == pytest.approx(want)
    rng = random.Random(5)
    drawn = [r for _ in range(2000) for r in eagle_fit.sample_batch(rng, records, weights, 4)]
    share = sum(r["kind"] == "code" for r in drawn) / len(drawn)
    assert abs(share - want) < 0.02, share  # binomial sd 0.0055 at 8000 draws
    batch = eagle_fit.sample_batch(rng, records, None, 4)  # weight 1: uniform, no repeats
    assert len({id(r) for r in batch}) == 4


def test_a_code_weight_draws_code_that_much_more_often():
    check_code_weight()


def test_the_mix_check_fails_when_the_weight_is_ignored(monkeypatch):
    import planted_bugs as bug

    bug.eagle_code_weight_ignored(monkeypatch)
    with pytest.raises(AssertionError):
        check_code_weight()


def _score(first: float, accepted: float) -> dict:
    return {"first_position_acceptance": first, "mean_accepted_per_step": accepted}


def check_verdict() -> None:
    shipped = {"chat": _score(0.35, 0.49), "code": _score(0.52, 0.92)}
    assert eagle_gonogo.verdict(shipped, {"chat": _score(0.40, 0.55), "code": _score(0.55, 1.0)})
    assert not eagle_gonogo.verdict(shipped, {"chat": _score(0.40, 0.45),
                                              "code": _score(0.55, 1.0)})
    assert not eagle_gonogo.verdict(shipped, {"chat": _score(0.40, 0.55),
                                              "code": _score(0.50, 1.0)})
    assert not eagle_gonogo.verdict(shipped, shipped)
    # a measured head carries its training record beside its kinds: not a kind to judge
    trained = {"training": {"steps": 600, "mix": {"code_weight": 8.0}}}
    assert eagle_gonogo.verdict({**shipped, **trained},
                                {"chat": _score(0.40, 0.55), "code": _score(0.55, 1.0), **trained})


def test_the_go_no_go_needs_every_kind_and_both_measures():
    check_verdict()


def test_the_go_no_go_check_fails_with_a_lenient_verdict(monkeypatch):
    import planted_bugs as bug

    bug.eagle_gonogo_either_measure(monkeypatch)
    with pytest.raises(AssertionError):
        check_verdict()
