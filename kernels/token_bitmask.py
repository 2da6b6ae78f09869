"""Token bitmasks (a grammar's allowed tokens, 32 per int32 word, as xgrammar writes them) as
the boolean masks the logits processors read. Pure tensor functions."""

from __future__ import annotations

import torch

__all__ = ["banned_from_bitmask"]


def banned_from_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """bitmask int32 [R, ceil(V / 32)] (bit j of word w set: token 32 w + j allowed) -> bool
    [R, V], True where the token is banned."""
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = (bitmask.unsqueeze(-1) >> bits) & 1  # [R, W, 32]; & 1 undoes the sign's shift
    return (allowed == 0).reshape(bitmask.shape[0], -1)[:, :vocab]
