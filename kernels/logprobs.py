"""Log-probabilities of emitted tokens under the distribution the request samples from.

The verifier already has the target's logits row of every emitted token (row j of a sequence
picks its token j: an accepted draft, or the recovered / bonus token); these rows are shaped by
the same `apply_sampling_params` as sampling, so the reported numbers do not depend on whether
speculation ran. A greedy row (temperature 0) would be one-hot; it reports the temperature-1
distribution with its top-k / top-p / min-p instead, as other OpenAI-compatible servers do.
Tokens outside the kept set (probability 0) get FLOOR rather than -inf, which JSON cannot carry.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.sampling import SamplingTensors

__all__ = ["FLOOR", "TokenLogprobs", "token_logprobs"]

FLOOR = -9999.0  # log-probability reported for a token of probability 0


@dataclass(frozen=True)
class TokenLogprobs:
    """Per row: the chosen token's log-probability and the `num_top` most likely ones."""

    chosen: torch.Tensor  # float32 [R]
    top_ids: torch.Tensor  # int64 [R, num_top], most likely first
    top_values: torch.Tensor  # float32 [R, num_top]


def token_logprobs(logits: torch.Tensor, params: SamplingTensors, token_ids: torch.Tensor,
                   num_top: int) -> TokenLogprobs:
    """logits [R, V], one row per emitted token; token_ids [R] the tokens emitted."""
    # greedy rows: temperature 1, the other parameters as given
    temperature = torch.where(params.temperature == 0, torch.ones_like(params.temperature),
                              params.temperature)
    probs = SamplingTensors(temperature, params.top_k, params.top_p, params.min_p).apply(logits)
    logp = probs.log().clamp(min=FLOOR)  # [R, V]; log(0) = -inf -> FLOOR
    chosen = logp.gather(1, token_ids.to(logp.device, torch.long).unsqueeze(1)).squeeze(1)
    top = logp.topk(min(num_top, logp.shape[1]), dim=-1) if num_top else None
    empty = torch.zeros(logp.shape[0], 0)
    return TokenLogprobs(chosen.cpu(), top.indices.cpu() if top else empty.long(),
                         top.values.cpu() if top else empty)
