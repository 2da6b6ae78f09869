"""Log-probabilities of emitted tokens: the distribution the request samples from, greedy rows
at temperature 1, tokens outside top-k / top-p at the floor."""

from __future__ import annotations

import torch

from kernels.logprobs import FLOOR, token_logprobs
from kernels.sampling import SamplingTensors


def test_greedy_rows_report_the_temperature_one_distribution():
    torch.manual_seed(0)
    logits = torch.randn(3, 11)
    chosen = logits.argmax(dim=-1)
    out = token_logprobs(logits, SamplingTensors.from_lists([0.0, 0.0, 0.0]), chosen, 4)
    expected = logits.log_softmax(dim=-1)
    assert torch.allclose(out.chosen, expected.gather(1, chosen[:, None])[:, 0], atol=1e-5)
    assert torch.equal(out.top_ids[:, 0], chosen)
    assert torch.allclose(out.top_values, expected.topk(4).values, atol=1e-5)


def test_temperature_and_top_k_shape_the_reported_numbers():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    out = token_logprobs(logits, SamplingTensors.from_lists([0.5], top_k=[2]),
                         torch.tensor([1]), 4)
    kept = (logits[0, :2] / 0.5).log_softmax(dim=-1)
    assert torch.allclose(out.chosen, kept[1:2], atol=1e-5)
    assert out.top_values[0, 2:].tolist() == [FLOOR, FLOOR]
    zero = token_logprobs(logits, SamplingTensors.from_lists([1.0], top_k=[1]),
                          torch.tensor([3]), 0)
    assert zero.chosen.tolist() == [FLOOR] and zero.top_ids.shape == (1, 0)
