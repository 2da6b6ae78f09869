"""A step's greedy EAGLE chains over several sequences at once, replayed as one captured
iteration per batch bucket (the batched form of verifier_service/eagle_graphs.py's chain).

Where the device captures graphs, a lone sequence's chain replays its own iteration graph; a
step of B sequences replayed B x (k - 1) of them, each a few dozen kernels of one row. Here the
step's sequences draft together, one replay per drafted level for all of them:

    keys, values  [B_max, kv_heads, capacity, head_dim]: row i holds sequence i's columns
                  (copied in, device to device, before the replays) and the rows being written
    hidden, logits  [B_max, H], [B_max, Vd]: each row's predictor of its next token (the roots,
                  then each fed token's output)
    col [B_max]   the column each row's next fed token is written at (its position); padding
                  rows start at 0 and write only their own row
    j [1]         the drafted level, tokens [B_max, max_k] the drafted target ids

The iteration for bucket b takes the argmax of each row's logits as its token j, feeds it at
the row's own column (keys and values scattered there, attention over the capacity masked to
the columns up to it), and leaves the outputs and logits in place; col and j move on. A step's
chains are one copy in per sequence, max(k) - 1 replays, one argmax and one copy of the tokens
out of the static buffers; the tokens stay on the device (greedy chains are fed to the step
from there, verifier_service/in_target.py DeviceDraft). A sequence asking fewer than max(k)
tokens takes the first of its row. More sequences than the largest bucket draft in groups.

On the CPU the iteration runs eagerly over the same buffers (what the tests compare with
eagle_head.chain_many); the head batches its eager chains itself there.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch

from splitspec import device as dev
from splitspec.graphs import powers_up_to
from verifier_service.eagle_head import EagleHead, EagleSequence

log = logging.getLogger(__name__)


class EagleChainBatch:
    def __init__(self, head: EagleHead, capacity: int, max_k: int, max_batch: int):
        """capacity: columns a sequence may reach and draft from; max_k: drafted tokens per
        chain at most; max_batch: sequences per replay (buckets: powers of two up to it)."""
        s, device = head.spec, head.device
        self.head, self.device = head, device
        self.capacity, self.max_k = capacity, max_k
        self.buckets = powers_up_to(max(2, max_batch))
        b = self.buckets[-1]
        shape = (b, s.num_kv_heads, capacity, s.head_dim)
        self.keys = torch.zeros(shape, dtype=head.dtype, device=device)
        self.values = torch.zeros(shape, dtype=head.dtype, device=device)
        self.hidden = torch.zeros(b, s.hidden_size, dtype=head.dtype, device=device)
        with torch.no_grad():
            width = head.logits(self.hidden[:1]).shape[-1]
        self.logits = torch.zeros(b, width, dtype=head.dtype, device=device)
        self.col = torch.zeros(b, dtype=torch.long, device=device)
        self.j = torch.zeros(1, dtype=torch.long, device=device)
        self.tokens = torch.zeros(b, max_k, dtype=torch.long, device=device)
        self.columns = torch.arange(capacity, device=device)
        self.graphs: dict[int, object] = {}

    @property
    def bytes(self) -> int:
        """Device memory of the static buffers."""
        return sum(t.numel() * t.element_size() for t in (
            self.keys, self.values, self.hidden, self.logits, self.col, self.tokens))

    @property
    def captured(self) -> bool:
        """Whether a step's chains replay graphs here."""
        return bool(self.graphs)

    def bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def serves(self, seq: EagleSequence, k: int) -> bool:
        """Whether a chain of k from this sequence's root fits (every column it writes,
        length .. length + k - 2, within the capacity)."""
        return 0 < k <= self.max_k and seq.root_out is not None and \
            seq.length + k - 1 <= self.capacity

    # -- one level (what a graph records) ----------------------------------------------------

    def pick(self, b: int) -> torch.Tensor:
        """Each row's token j: the argmax of its logits, written at column j of tokens. [b]"""
        tok = self.head.target_ids(self.logits[:b].argmax(-1))  # [b]
        self.tokens[:b].index_copy_(1, self.j, tok[:, None])
        return tok

    def iteration(self, b: int) -> None:
        """Rows [0, b): token j picked and fed at each row's column; hidden, logits, col and j
        move on."""
        head, spec = self.head, self.head.spec
        tok = self.pick(b)
        col = self.col[:b]
        mask = visible_columns_rows(self.columns, col)  # [b, 1, 1, C]
        at = col[:, None, None, None].expand(b, spec.num_kv_heads, 1, spec.head_dim)
        keys, values = self.keys[:b], self.values[:b]

        def attend(q, k, v):
            keys.scatter_(2, at, k)
            values.scatter_(2, at, v)
            return head.attention(q, keys, values, mask)

        out = head.layer(tok[:, None], self.hidden[:b, None], col[:, None], attend,
                         self.capacity)[:, 0]  # [b, H]
        self.hidden[:b].copy_(out)
        self.logits[:b].copy_(head.logits(out))
        col.add_(1)
        self.j.add_(1)

    def _run(self, b: int) -> None:
        graph = self.graphs.get(b)
        if graph is not None:
            graph.replay()
        else:
            self.iteration(b)

    # -- capture ---------------------------------------------------------------------------------

    def capture(self, capture_one) -> None:
        """One graph per bucket, largest first (capture_one(body, what) -> graph or None:
        EagleGraphs' capture, in its pool and stream)."""
        for b in reversed(self.buckets):
            graph = capture_one(lambda b=b: self.iteration(b),
                                f"the chain iteration over {b} sequences")
            if graph is not None:
                self.graphs[b] = graph

    def reset(self) -> None:
        self.col.zero_()
        self.j.zero_()

    # -- a step's chains ---------------------------------------------------------------------------

    @torch.no_grad()  # not inference mode: tensors it makes stay writable by the eager code
    def chains(self, seqs: Sequence[EagleSequence], ks: Sequence[int]) -> list[torch.Tensor]:
        """Each sequence's greedy chain of ks[i] target ids (serves() must hold for each), on
        the device, out of the static buffers: the tokens EagleSequence.chain drafts."""
        top = self.buckets[-1]
        out: list[torch.Tensor] = []
        for at in range(0, len(seqs), top):
            group, group_ks = seqs[at:at + top], ks[at:at + top]
            tokens = self._group(group, max(group_ks))
            out += [tokens[i, :k] for i, k in enumerate(group_ks)]
        return out

    def _group(self, seqs: Sequence[EagleSequence], k: int) -> torch.Tensor:
        n = len(seqs)
        b = self.bucket(n)
        for i, s in enumerate(seqs):  # each sequence's columns into its row
            self.keys[i, :, :s.length].copy_(s.keys[0, :, :s.length])
            self.values[i, :, :s.length].copy_(s.values[0, :, :s.length])
        self.hidden[:n].copy_(torch.stack([s.root_out for s in seqs]))
        self.logits[:n].copy_(torch.stack([s.root_logits for s in seqs]))
        cols = [s.length for s in seqs] + [0] * (b - n)  # padding rows write only their own
        self.col[:b].copy_(dev.to_device(torch.tensor(cols), self.device))
        self.j.zero_()
        for _ in range(k - 1):
            self._run(b)
        self.pick(b)
        return self.tokens[:n, :k].clone()


def visible_columns_rows(columns: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """What each row's token fed at its column col [b] sees: every column up to its own.
    [b, 1, 1, C]"""
    return (columns[None, :] <= col[:, None])[:, None, None, :]
