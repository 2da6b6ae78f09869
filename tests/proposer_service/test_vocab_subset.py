"""Output heads restricted to a frequency-ranked vocabulary subset (FR-Spec): the subset's
logits are the full head's, every other token is -inf, the draft and MLP proposers draft only
subset tokens (greedy: the argmax over the subset; sampled: q is zero outside it), the
frequency file and the --vocab-subset setting, and the planted-bug control."""

from __future__ import annotations

import json
from collections import Counter

import planted_bugs as bug
import pytest
import torch
from tiny_proposer_models import make_mlp_speculator

from kernels.linear import available, fp16_exact
from kernels.vocab_subset import SubsetHead, scatter_logits, subset_ids
from proposer_service.draft.proposer import DraftModelProposer
from proposer_service.mlp.proposer import MlpSpeculatorProposer
from splitspec.lean_llama import LeanDecoder
from splitspec.params import SamplingParams
from splitspec.proposal import SequenceStep
from splitspec.vocab_frequencies import FREQUENCIES, resolve_subset, write_frequencies

CPU = torch.device("cpu")
V = 1024  # tests/fixtures/tiny-llama's vocabulary
SUBSET = torch.arange(3, V, 7)  # 146 tokens, neither the most likely nor contiguous


def test_subset_ids_are_the_first_distinct_ranked_ids_sorted():
    assert subset_ids([9, 2, 9, 5, 7], 3, 10).tolist() == [2, 5, 9]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        subset_ids([3, 10], 2, 10)
    with pytest.raises(ValueError, match="only 2 ranked tokens"):
        subset_ids([1, 2, 2], 3, 10)
    with pytest.raises(ValueError, match=">= 1"):
        subset_ids([1], 0, 10)


def test_scatter_puts_each_logit_at_its_token_and_minus_inf_elsewhere():
    out = scatter_logits(torch.tensor([[1.0, 2.0]]), torch.tensor([1, 3]), 5)
    assert out.tolist() == [[float("-inf"), 1.0, float("-inf"), 2.0, float("-inf")]]


@pytest.mark.parametrize("backend", ["dense", "onednn", "fp16"])
def test_the_subset_head_scores_its_tokens_as_the_full_head(backend):
    if not available(backend):
        pytest.skip(f"{backend} is not available on this CPU")
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(V, 64, generator=g).half().float()
    assert fp16_exact(weight)
    x = torch.randn(3, 2, 64, generator=g)
    out = SubsetHead(weight, SUBSET, backend)(x)
    full = x @ weight.T
    assert out.shape == (3, 2, V)
    torch.testing.assert_close(out[..., SUBSET], full[..., SUBSET], rtol=1e-4, atol=1e-4)
    rest = torch.ones(V, dtype=torch.bool)
    rest[SUBSET] = False
    assert torch.isneginf(out[..., rest]).all()


def test_the_setting_reads_the_frequency_file(tmp_path):
    assert resolve_subset(tmp_path, "auto", V) is None  # no file: the whole vocabulary
    with pytest.raises(ValueError, match=FREQUENCIES):
        resolve_subset(tmp_path, "64", V)
    with pytest.raises(ValueError, match="auto or a token count"):
        resolve_subset(tmp_path, "many", V)
    counts = Counter({t: V - t for t in range(200)})
    write_frequencies(tmp_path / FREQUENCIES, counts, "test", recommended_subset=100)
    assert resolve_subset(tmp_path, "auto", V).tolist() == list(range(100))
    assert resolve_subset(tmp_path, "10", V).tolist() == list(range(10))
    assert resolve_subset(tmp_path, "0", V) is None
    assert resolve_subset(tmp_path, str(V), V) is None  # the whole vocabulary anyway
    with pytest.raises(ValueError, match="only 200 ranked tokens"):
        resolve_subset(tmp_path, "300", V)
    (tmp_path / FREQUENCIES).write_text(json.dumps({"ranked_ids": "x"}))
    with pytest.raises(ValueError, match="malformed"):
        resolve_subset(tmp_path, "auto", V)


@pytest.fixture(scope="module")
def draft_pair(noisy_draft_dir):
    torch.set_num_threads(1)
    full = DraftModelProposer.load(noisy_draft_dir, CPU, torch.float32, vocab_subset="0")
    sub = DraftModelProposer(full.model, CPU, V, full.fingerprint, vocab_subset=SUBSET)
    return full, sub


HISTORY = [5, 17, 230, 41, 9, 88, 301, 12]


@torch.inference_mode()
def reference_subset_greedy(model, history: list[int], k: int) -> list[int]:
    ids = list(history)
    for _ in range(k):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        ids.append(int(SUBSET[logits[SUBSET].argmax()]))
    return ids[len(history):]


def check_subset_greedy_drafts(proposer) -> None:
    session = proposer.open_session()
    (d,) = session.propose([SequenceStep("s", HISTORY, len(HISTORY), 5, full_history=True)])
    assert d.tokens == reference_subset_greedy(proposer.model, HISTORY, 5)


def test_greedy_drafts_are_the_argmax_over_the_subset(draft_pair):
    full, sub = draft_pair
    check_subset_greedy_drafts(sub)
    (d,) = full.open_session().propose([SequenceStep("s", HISTORY, 8, 5, full_history=True)])
    assert not set(d.tokens) <= set(SUBSET.tolist())  # the whole head drafts other tokens


def test_a_control_subset_scattered_one_token_off_is_caught(draft_pair, monkeypatch):
    bug.subset_logits_one_token_off(monkeypatch)
    with pytest.raises(AssertionError):
        check_subset_greedy_drafts(draft_pair[1])


def test_sampled_drafts_come_from_the_subset_and_say_so_in_q(draft_pair):
    _, sub = draft_pair
    inside = set(SUBSET.tolist())
    sampling = SamplingParams(temperature=1.0, seed=3)
    (d,) = sub.open_session().propose([SequenceStep("s", HISTORY, 8, 4, full_history=True,
                                                    sampling=sampling)])
    assert set(d.tokens) <= inside
    for ids, probs in d.q.rows():
        assert set(ids) <= inside and abs(sum(probs) - 1) < 1e-4


def test_a_subset_needs_the_lean_forward(draft_pair, monkeypatch):
    monkeypatch.setattr(LeanDecoder, "supports", staticmethod(lambda model: False))
    with pytest.raises(ValueError, match="lean forward"):
        DraftModelProposer(draft_pair[0].model, CPU, V, "", vocab_subset=SUBSET)


def test_mlp_heads_score_the_subset_only(tiny_target_dir, tmp_path):
    spec_dir = make_mlp_speculator(tiny_target_dir, tmp_path / "mlp", n_predict=3)
    counts = Counter({int(t): V - int(t) for t in SUBSET})
    write_frequencies(spec_dir / FREQUENCIES, counts, "test", recommended_subset=len(SUBSET))
    full = MlpSpeculatorProposer.load(str(spec_dir), CPU, torch.float32, vocab_subset="0",
                                      linear="dense")
    sub = MlpSpeculatorProposer.load(str(spec_dir), CPU, torch.float32, linear="dense")  # auto
    h = torch.randn(1, 64, generator=torch.Generator().manual_seed(1))
    state, tok, want = full.model.input_state(h), torch.tensor([7]), []
    with torch.inference_mode():
        for i in range(3):
            state, logits = full.model.step(state, tok, i)
            tok = SUBSET[logits[0, SUBSET].argmax()][None]
            want.append(int(tok))
        got = sub.model.generate_suggestions(h, torch.tensor([7]), 3)[0].tolist()
    assert got == want
