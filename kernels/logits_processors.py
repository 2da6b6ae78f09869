"""Logits processors: penalties, logit bias and token masks on a step's logits rows, each row
with its own history. Pure tensor functions; the verifier builds their inputs once per step
(verifier_service/step/sampling_state.py).

Per processed row r (a chain row, a tree node or a bonus row), in this order, on raw logits:
    1. repetition penalty ρ (vLLM's and Hugging Face's RepetitionPenaltyLogitsProcessor): a
       token seen in the prompt or the row's output history:
           x / ρ where x > 0, x * ρ otherwise
    2. frequency f and presence p (OpenAI's formula), c the token's count in the row's output
       history:      x - (c * f + p) where c > 0
    3. logit bias:   x + bias
    4. masks:        -inf where banned (tokens outside allowed_token_ids, bad words' last tokens
       after their prefixes, EOS and stop tokens before min_tokens). A row whose soft masks
       (bad words, min_tokens) would leave it no token keeps its hard mask (allowed_token_ids)
       only: it still draws a token, never a NaN.
Temperature, top-k, top-p and min-p come after (kernels/sampling.py).

Every operation is elementwise along a row, so a row's result depends on its logits and its
history only, never on how many rows share the call or which: a greedy request gives the same
tokens with speculation on and off, and a seeded one the same draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["ProcessorRows", "apply_processors", "process_rows"]


@dataclass
class ProcessorRows:
    """What the processors read for R processed rows, on the logits' device."""

    rows: torch.Tensor  # int64 [R]: which rows of the step's logits are processed
    # float32 [R, V]: each token's count in the row's output history; None: no row has a
    # frequency or presence penalty (the stage is skipped)
    counts: Optional[torch.Tensor]
    # bool [R, V]: the token is in the prompt or the row's output history; None: no row has a
    # repetition penalty
    seen: Optional[torch.Tensor]
    repetition: torch.Tensor  # float32 [R, 1]; 1: off
    frequency: torch.Tensor  # float32 [R, 1]; 0: off
    presence: torch.Tensor  # float32 [R, 1]; 0: off
    bias: Optional[torch.Tensor]  # float32 [R, V]; None: no row has a bias
    hard: Optional[torch.Tensor]  # bool [R, V]: banned by allowed_token_ids; None: none
    soft: Optional[torch.Tensor]  # bool [R, V]: banned by bad words and min_tokens; None: none


def process_rows(x: torch.Tensor, p: ProcessorRows) -> torch.Tensor:
    """x [R, V] float32 (the processed rows' logits) -> the processed logits [R, V]."""
    # 1. repetition: shrink the logit of a seen token towards "less likely" by ρ
    if p.seen is not None:
        penalised = torch.where(x > 0, x / p.repetition, x * p.repetition)
        x = torch.where(p.seen, penalised, x)
    # 2. frequency and presence, over the output history only
    if p.counts is not None:  # c * f + p where c > 0 (OpenAI's formula), one pass
        x = x - torch.where(p.counts > 0, p.counts * p.frequency + p.presence, 0.0)
    # 3. bias
    if p.bias is not None:
        x = x + p.bias
    # 4. masks: the soft ones only where they leave the row a token
    banned = p.hard
    if p.soft is not None:
        both = p.soft if banned is None else (p.soft | banned)
        empty = both.all(dim=-1, keepdim=True)  # [R, 1]
        banned = torch.where(empty, banned if banned is not None else torch.zeros_like(both),
                             both)
    if banned is not None:
        x = x.masked_fill(banned, float("-inf"))
    return x


def apply_processors(logits: torch.Tensor, p: ProcessorRows) -> torch.Tensor:
    """logits [T, V] -> a copy with rows p.rows processed (the others unchanged, bit for bit)."""
    x = logits.index_select(0, p.rows).to(torch.float32)
    out = logits.to(torch.float32, copy=True)
    return out.index_copy_(0, p.rows, process_rows(x, p))
