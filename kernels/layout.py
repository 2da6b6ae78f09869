"""Where every sequence's rows sit in one engine step: built once per step, read by the model
runner (packed input, positions, which rows get logits) and by the rejection sampler (draft and
target offsets), so the index arithmetic lives in one place.

A step packs, per sequence i, its uncached tokens followed by its k_i draft tokens:
    input rows      [T_in],  T_in = sum_i query_len_i, query_len_i = num_new_i + k_i
    logits rows     [T_out], T_out = sum over emitting i of (k_i + 1): the last k_i + 1 input
                    rows of i (p at d_1..d_k, then the bonus position)
    draft rows      [D],     D = sum over emitting i of k_i
A sequence *emits* when the step caches the end of its prompt (decoding always does; a prefill
chunk that stops short of the end emits nothing and drafts nothing). The sampler's batch is the
emitting sequences, in step order.

Example: sequence 0 decodes with k = 2, sequence 1 is a 3-token prefill chunk that emits nothing,
sequence 2 decodes with k = 0:
    input rows   [a d1 d2 | x y z | b]      query_start = [0, 3, 6]
    logits rows  [0 1 2 6]                  target_offsets = [0, 3]  (over emitting 0 and 2)
    draft rows   [d1 d2]                    draft_offsets  = [0, 2]

Which rows a row attends to is the layout's too. Every fed row has a parent among its sequence's
fed rows (`parents`, local indices; -1: the last cached token): the uncached tokens form a chain,
and each draft node hangs off the last uncached token (-1 in `draft_parents`) or off an earlier
draft node. A row sits at the position of its depth (start position + depth) and sees the
sequence's cached tokens, its ancestors and itself. For a chain (parents i - 1, today's drafts) that
is the causal mask and the attention path builds it arithmetically; any other tree carries the
relation as `ancestors` [B, max_q, max_q], once per step, shared by every layer. A sequence's fed
row j is stored in the cache column start_pos + j whatever its position, so after verification the
rows to keep are named by their fed index (verifier_service/kv/cache.py `keep`).

Example: sequence 0 above with draft_parents [-1, -1] (two alternatives for one position):
    positions    [p p+1 p+1 | ...]          d1 and d2 both at depth 1; d2 does not see d1

Attention reads only `query_positions` and the relation (verifier_service/kv/paged_attention.py),
not the parents, so rows whose visibility is not a tree (lookahead decoding's 2-D window) need only
a way to fill the relation; rows whose K/V is scratch are simply left out of the kept rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

__all__ = ["PLACEHOLDER_TOKEN_ID", "RejectionResult", "StepLayout"]

PLACEHOLDER_TOKEN_ID = -1  # pads output_token_ids after the last valid token of a row


def _host(values, dtype=torch.int64) -> torch.Tensor:
    if torch.is_tensor(values):
        return values.to(dtype).cpu().reshape(-1)
    return torch.tensor(values, dtype=dtype).reshape(-1)


@dataclass(frozen=True)
class StepLayout:
    """Host-side (CPU) index tensors of one step. Sampler fields cover emitting sequences only."""

    # -- the whole step, one entry per sequence [B]
    query_lens: torch.Tensor  # int64 [B]: uncached tokens + drafts fed this step
    start_pos: torch.Tensor  # int64 [B]: tokens already cached (position of the first fed row)
    query_start: torch.Tensor  # int64 [B]: first input row of each sequence
    emits: torch.Tensor  # bool [B]
    logits_indices: torch.Tensor  # int64 [T_out]: input rows whose logits are needed
    # -- the sampler's batch: emitting sequences only [S]
    seq_index: torch.Tensor  # int64 [S]: which step sequence each sampler row is
    num_draft_tokens: torch.Tensor  # int64 [S]
    draft_offsets: torch.Tensor  # int64 [S]: first draft row of each in [D]
    target_offsets: torch.Tensor  # int64 [S]: first logits row of each in [T_out]
    sample_positions: torch.Tensor  # int64 [S]: position of the token the first logits row picks
    num_drafts: int  # D
    max_k: int
    # -- per fed row, and the ancestor relation among each sequence's fed rows
    query_positions: torch.Tensor  # int64 [T_in]: start_pos + depth of every input row
    parents: torch.Tensor  # int64 [T_in]: fed-row index of its parent in its sequence (-1: cache)
    max_query_len: int
    # bool [B, max_q, max_q]: [b, j, a] = fed row a of sequence b is row j or an ancestor of it;
    # None when every sequence is a chain (the causal relation: a <= j)
    ancestors: Optional[torch.Tensor] = None

    @property
    def chain(self) -> bool:
        """Whether every sequence's fed rows are a chain (the causal case)."""
        return self.ancestors is None

    @classmethod
    def build(cls, query_lens: Sequence[int], start_pos: Sequence[int],
              num_draft_tokens: Sequence[int], emits: Sequence[bool],
              draft_parents: Optional[Sequence[Optional[Sequence[int]]]] = None
              ) -> "StepLayout":
        """From per-sequence counts; num_draft_tokens of a non-emitting sequence must be 0.
        draft_parents (default: every draft a chain): per sequence None (a chain) or, for each of
        its k draft nodes in order, its parent: -1 (the last uncached token) or an earlier node."""
        # Per-sequence arithmetic on Python ints (B is small; each torch op on a handful of
        # numbers costs microseconds), then one tensor per field.
        q, s, k_all = _ints(query_lens), _ints(start_pos), _ints(num_draft_tokens)
        e = [bool(x) for x in (emits.tolist() if torch.is_tensor(emits) else emits)]
        if not (len(q) == len(s) == len(k_all) == len(e)):
            raise ValueError("query_lens, start_pos, num_draft_tokens, emits differ in length")
        if k_all and min(k_all) < 0:
            raise ValueError("num_draft_tokens must be >= 0")
        if any(k_i and not e_i for k_i, e_i in zip(k_all, e)):
            raise ValueError("a sequence that does not emit cannot verify drafts")
        if any(q_i < k_i + e_i for q_i, k_i, e_i in zip(q, k_all, e)):
            raise ValueError("an emitting sequence feeds at least its k drafts + 1 rows")
        query_start = _offsets(q)
        seq_index = [i for i, e_i in enumerate(e) if e_i]
        k = [k_all[i] for i in seq_index]
        rows = [n + 1 for n in k]
        logits_indices = [r for i, n in zip(seq_index, rows)
                          for r in range(query_start[i] + q[i] - n, query_start[i] + q[i])]
        positions, parents, ancestors = _rows(q, s, query_start, k_all, draft_parents)
        return cls(query_lens=_host(q), start_pos=_host(s), query_start=_host(query_start),
                   emits=_host(e, torch.bool), logits_indices=_host(logits_indices),
                   seq_index=_host(seq_index), num_draft_tokens=_host(k),
                   draft_offsets=_host(_offsets(k)), target_offsets=_host(_offsets(rows)),
                   sample_positions=_host([s[i] + q[i] - k_all[i] for i in seq_index]),
                   num_drafts=sum(k), max_k=max(k, default=0),
                   query_positions=positions, parents=parents, max_query_len=max(q, default=0),
                   ancestors=ancestors)

    @classmethod
    def for_drafts(cls, num_draft_tokens, sample_positions: Optional[Sequence[int]] = None
                   ) -> "StepLayout":
        """A sampler-only layout: every sequence emits, feeding its last token + k drafts.
        sample_positions (default 1 each) sets where each sequence's first sampled token sits."""
        k = _host(num_draft_tokens)
        pos = _host(sample_positions) if sample_positions is not None else torch.ones_like(k)
        if pos.numel() != k.numel():
            raise ValueError("sample_positions needs one entry per sequence")
        if pos.numel() and int(pos.min()) < 1:
            raise ValueError("a sampled token has position >= 1 (it follows at least one token)")
        return cls.build(k + 1, pos - 1, k, torch.ones(k.numel(), dtype=torch.bool))

    @property
    def num_seqs(self) -> int:
        return self.query_lens.numel()

    @property
    def batch_size(self) -> int:
        """Sequences the sampler sees (the emitting ones)."""
        return self.seq_index.numel()

    @property
    def num_tokens(self) -> int:
        return int(self.query_lens.sum())

    def positions(self) -> torch.Tensor:
        """int64 [T_in]: the position of every input row (start position + depth)."""
        return self.query_positions

    def padded_indices(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(draft row, target row, valid), each [S, max_k]; invalid slots point at safe rows."""
        j = torch.arange(self.max_k, dtype=torch.int64)
        k = self.num_draft_tokens.unsqueeze(1)
        valid = j.unsqueeze(0) < k  # [S, max_k]
        draft_idx = (self.draft_offsets.unsqueeze(1) + j).clamp(max=max(self.num_drafts - 1, 0))
        target_idx = self.target_offsets.unsqueeze(1) + torch.minimum(j.unsqueeze(0), k)
        return draft_idx, target_idx, valid

    def row_positions(self) -> torch.Tensor:
        """int64 [T_out]: the position of the token each logits row picks."""
        k = self.num_draft_tokens
        if not k.numel():
            return torch.zeros(0, dtype=torch.int64)
        return torch.cat([torch.arange(int(p), int(p) + int(n) + 1)
                          for p, n in zip(self.sample_positions, k)])


def _ints(values) -> list[int]:
    return values.tolist() if torch.is_tensor(values) else [int(v) for v in values]


def _offsets(lengths: list[int]) -> list[int]:
    """Exclusive prefix sums: where each of consecutive runs of these lengths starts."""
    out, at = [], 0
    for n in lengths:
        out.append(at)
        at += n
    return out


def _rows(q: list[int], s: list[int], query_start: list[int], k: list[int], draft_parents
          ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Per fed row: position and parent (local fed index, -1: the cache), int64 [T_in] each; and
    the ancestor relation [B, max_q, max_q] unless every sequence is a chain (None)."""
    if len(q) == 1:  # one sequence (the common decode step): two aranges
        positions, parents = torch.arange(s[0], s[0] + q[0]), torch.arange(-1, q[0] - 1)
    else:
        local = (torch.arange(sum(q)) - torch.repeat_interleave(_host(query_start), _host(q))
                 if q else torch.zeros(0, dtype=torch.int64))  # [T_in]: j within its sequence
        positions = torch.repeat_interleave(_host(s), _host(q)) + local  # a chain: depth = j
        parents = local - 1
    if draft_parents is None:
        return positions, parents, None
    if len(draft_parents) != len(q):
        raise ValueError("draft_parents needs one entry (or None) per sequence")
    # a chain given as parents (i - 1) is a chain: the causal fast path
    draft_parents = [None if p is not None and list(p) == list(range(-1, n - 1)) else p
                     for p, n in zip(draft_parents, k)]
    if all(p is None for p in draft_parents):
        return positions, parents, None
    # Python ints and numpy rows: a torch op on one element costs microseconds, and a tree
    # step has tens of nodes (this ran per node and per row, ~0.5 ms of a GPU step's host time)
    pos, par = positions.numpy().copy(), parents.numpy().copy()
    b, max_q = len(q), max(q)
    anc = np.zeros((b, max_q, max_q), dtype=np.bool_)
    for i, given in enumerate(draft_parents):
        anc[i, :q[i], :q[i]] = np.tri(q[i], dtype=np.bool_)  # a chain: itself and those before
        if given is None:
            continue
        if len(given) != k[i]:
            raise ValueError(f"sequence {i}: {len(given)} draft parents for {k[i]} drafts")
        first, root = query_start[i], q[i] - k[i] - 1  # root: fed index of the last uncached
        seen = anc[i]
        for d, p in enumerate(given):
            p = int(p)
            if not -1 <= p < d:  # an earlier node: no cycle, nodes in topological order
                raise ValueError(f"sequence {i}: draft {d}'s parent {p} is not in [-1, {d})")
            j, parent = root + 1 + d, root + 1 + p if p >= 0 else root
            par[first + j] = parent
            pos[first + j] = pos[first + parent] + 1
            # ancestors-or-self: what its parent sees (an earlier row, already final), itself
            seen[j] = seen[parent]
            seen[j, j] = True
    return torch.from_numpy(pos), torch.from_numpy(par), torch.from_numpy(anc)


@dataclass
class RejectionResult:
    """output_token_ids: int64 [S, max_k + 1], row i = accepted drafts then one recovered/bonus
    token, padded with PLACEHOLDER_TOKEN_ID; num_accepted: int64 [S]. Row i has
    num_accepted[i] + 1 valid tokens."""

    output_token_ids: torch.Tensor  # int64 [S, max_k + 1]
    num_accepted: torch.Tensor  # int64 [S]

    def tokens(self) -> list[list[int]]:
        """Valid tokens per row as Python lists (host copy; for tests and the servicer edge)."""
        out = self.output_token_ids.cpu().tolist()
        n = self.num_accepted.cpu().tolist()
        return [row[: a + 1] for row, a in zip(out, n)]
