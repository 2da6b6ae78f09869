"""What a rejection-sampler implementation reads: the step's batch and its random numbers, all
drawn before any compute (kernels.rejection.rejection_sample does that), so the PyTorch reference
and the Triton kernel are pure functions of the same inputs and agree token for token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from kernels.layout import StepLayout
from kernels.sparse_probs import SparseProbs

DraftProbs = Union[None, torch.Tensor, SparseProbs]


@dataclass
class SamplerInputs:
    target_probs: torch.Tensor  # [T, V]
    draft_token_ids: torch.Tensor  # int64 [D]
    layout: StepLayout
    draft_probs: DraftProbs  # None (one-hot) | dense [D, V] | SparseProbs (D rows)
    greedy_host: torch.Tensor  # bool [S] on the CPU: rows decided without uniforms (greedy, seeded)
    uniforms: Optional[torch.Tensor]  # [D] acceptance uniforms, None when no row needs them
    exps: Optional[torch.Tensor]  # [S, V] Exp(1) noise, None when no row needs it
    target_argmax: Optional[torch.Tensor]  # [T] the deterministic rows' choice per row
