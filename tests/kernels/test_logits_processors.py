"""The logits processors (kernels/logits_processors.py) against their formulas written out here:
OpenAI's presence and frequency penalties and logit bias, Hugging Face's repetition penalty
(its own RepetitionPenaltyLogitsProcessor), the masks; and a row's result the same, bit for bit,
alone and among any other rows."""

from __future__ import annotations

import math

import torch
from transformers import RepetitionPenaltyLogitsProcessor

from kernels.logits_processors import ProcessorRows, apply_processors, process_rows

V = 50


def _rows(counts, seen, rep=1.0, freq=0.0, pres=0.0, bias=None, hard=None, soft=None):
    r = counts.shape[0]
    col = lambda v: torch.full((r, 1), float(v))  # noqa: E731
    return ProcessorRows(torch.arange(r), counts, seen, col(rep), col(freq), col(pres), bias,
                         hard, soft)


def _history(seed: int, n: int = 12):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n,), generator=g).tolist()


def test_presence_frequency_and_bias_follow_openais_formula():
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(0))
    output = _history(1)
    bias = {3: 5.0, 7: -100.0, 11: 0.5}
    counts = torch.zeros(1, V)
    for t in output:
        counts[0, t] += 1
    b = torch.zeros(1, V)
    for t, v in bias.items():
        b[0, t] = v
    got = process_rows(logits.clone(), _rows(counts, counts > 0, freq=0.7, pres=-0.4, bias=b))
    for j in range(V):  # mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence + bias
        c = output.count(j)
        want = logits[0, j].item() - c * 0.7 - (1.0 if c > 0 else 0.0) * -0.4 + bias.get(j, 0.0)
        assert math.isclose(got[0, j].item(), want, rel_tol=1e-6, abs_tol=1e-5), j


def test_repetition_penalty_equals_hugging_faces_processor():
    prompt, output = _history(2, 8), _history(3, 6)
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(4)) * 3
    seen = torch.zeros(1, V, dtype=torch.bool)
    seen[0, prompt + output] = True
    got = process_rows(logits.clone(), _rows(torch.zeros(1, V), seen, rep=1.3))
    want = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + output]), logits.clone())
    assert torch.equal(got, want)


def test_masks_ban_and_a_row_they_would_empty_keeps_its_hard_mask():
    logits = torch.randn(2, V)
    hard = torch.ones(2, V, dtype=torch.bool)
    hard[:, [4, 9]] = False  # allowed_token_ids = [4, 9]
    soft = torch.zeros(2, V, dtype=torch.bool)
    soft[0, 4] = True  # row 0: 9 is left
    soft[1, [4, 9]] = True  # row 1: nothing would be left: the soft mask is dropped
    got = process_rows(logits.clone(), _rows(torch.zeros(2, V), torch.zeros(2, V, dtype=bool),
                                              hard=hard, soft=soft))
    assert torch.isfinite(got[0]).nonzero().flatten().tolist() == [9]
    assert torch.isfinite(got[1]).nonzero().flatten().tolist() == [4, 9]


def test_a_row_is_processed_the_same_alone_and_among_other_rows():
    g = torch.Generator().manual_seed(5)
    n = 9
    logits = torch.randn(n, V, generator=g) * 4
    counts = torch.randint(0, 3, (n, V), generator=g).float()
    seen = (counts > 0) | (torch.rand(n, V, generator=g) < 0.1)
    bias = torch.randn(n, V, generator=g)
    proc = ProcessorRows(torch.arange(n), counts, seen, torch.rand(n, 1, generator=g) + 0.5,
                         torch.rand(n, 1, generator=g), torch.rand(n, 1, generator=g), bias,
                         None, None)
    together = apply_processors(logits, proc)
    for r in range(n):
        alone = ProcessorRows(torch.tensor([0]), counts[r:r + 1], seen[r:r + 1],
                              proc.repetition[r:r + 1], proc.frequency[r:r + 1],
                              proc.presence[r:r + 1], bias[r:r + 1], None, None)
        assert torch.equal(apply_processors(logits[r:r + 1], alone)[0], together[r]), r


def test_rows_not_named_are_left_bit_for_bit():
    logits = torch.randn(4, V)
    proc = _rows(torch.ones(1, V), torch.ones(1, V, dtype=torch.bool), rep=2.0, freq=1.0)
    proc.rows = torch.tensor([2])
    out = apply_processors(logits, proc)
    assert torch.equal(out[[0, 1, 3]], logits[[0, 1, 3]]) and not torch.equal(out[2], logits[2])
