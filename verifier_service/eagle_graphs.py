"""Greedy EAGLE chains replayed as device graphs: the head's drafting loop over static buffers.

On an accelerator one drafted token of the head is some forty eager launches (embedding, two
norms, the fused products, RoPE, attention, the MLP, the logits, the argmax): measured on an
H100, 1.2-1.5 ms a token beside a 1.3 ms captured target step. Here one drafted token is one
replay. The buffers, for one sequence at a time:

    keys, values  [1, kv_heads, capacity, head_dim]: the sequence's rows with target features
                  (copied in, device to device, before the replays) and the chain's scratch rows
    hidden, logits  the predictor of the next token: the root's output and logits, then each
                  fed token's
    col, j        the column the next fed token is written at (its position), the output index
    tokens        [max_k]: the drafted target ids

and one iteration (what the graph records) takes the argmax of `logits` as token j, feeds it at
column `col` with `hidden` (keys and values written there, attention over the capacity masked
to the columns up to `col`), leaves the output and its logits in `hidden` and `logits`, and
moves `col` and `j` on. A chain of k is one copy in, k - 1 replays, one argmax, one copy out:
the same tokens `EagleSequence.chain` drafts (what the tests compare, on the CPU, where the
iteration runs eagerly). The sequence's own buffer is not written: its scratch rows are
overwritten by the next `advance` anyway.

Sampled chains and trees keep the eager loops (their parameters and shapes vary per step). The
graph reads the head's RoPE table: it is grown to the capacity before capture and kept here, so
a later growth by eager drafting cannot free what the graph reads.
"""

from __future__ import annotations

import logging
import time

import torch

from splitspec import device as dev
from verifier_service.eagle_head import EagleHead, EagleSequence

log = logging.getLogger(__name__)


class EagleChainGraphs:
    def __init__(self, head: EagleHead, capacity: int, max_k: int, capture: bool = True):
        """capacity: columns (positions) a sequence may reach and draft from here (longer
        ones draft eagerly); max_k: drafted tokens per chain at most."""
        s, device = head.spec, head.device
        self.head, self.device = head, device
        self.capacity, self.max_k = capacity, max_k
        self.capture_wanted = capture and dev.supports_graphs(device)
        shape = (1, s.num_kv_heads, capacity, s.head_dim)
        self.keys = torch.zeros(shape, dtype=head.dtype, device=device)
        self.values = torch.zeros(shape, dtype=head.dtype, device=device)
        self.hidden = torch.zeros(s.hidden_size, dtype=head.dtype, device=device)
        with torch.no_grad():  # as wide as the head scores (a packed head's weights are gone)
            width = head.logits(self.hidden).shape[-1]
        self.logits = torch.zeros(width, dtype=head.dtype, device=device)
        self.col = torch.zeros(1, dtype=torch.long, device=device)
        self.j = torch.zeros(1, dtype=torch.long, device=device)
        self.tokens = torch.zeros(max_k, dtype=torch.long, device=device)
        self.columns = torch.arange(capacity, device=device)
        self.graph = None
        self._pool = None
        self._rope = None  # the RoPE table the graph reads (kept alive here)
        self.fetch = dev.HostFetch(device)

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def serves(self, seq: EagleSequence, k: int) -> bool:
        """Whether a greedy chain of k from this sequence's root runs here: every column it
        writes (length .. length + k - 2) fits the capacity."""
        return 0 < k <= self.max_k and seq.root_out is not None and \
            seq.length + k - 1 <= self.capacity

    # -- one iteration (what the graph records) --------------------------------------------------

    def iteration(self) -> None:
        """Token j = argmax(logits), fed at column col; hidden, logits, col and j move on."""
        head = self.head
        tok = head.target_ids(self.logits.argmax(-1, keepdim=True))  # [1]: a gather, no read
        self.tokens.index_copy_(0, self.j, tok)
        mask = visible_columns(self.columns, self.col)

        def attend(q, k, v):
            self.keys.index_copy_(2, self.col, k)
            self.values.index_copy_(2, self.col, v)
            return head.attention(q, self.keys, self.values, mask)

        out = head.layer(tok.view(1, 1), self.hidden.view(1, 1, -1), self.col.view(1, 1),
                         attend, self.capacity)[0, 0]
        self.hidden.copy_(out)
        self.logits.copy_(head.logits(out))
        self.col.add_(1)
        self.j.add_(1)

    def _run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.iteration()

    # -- capture ---------------------------------------------------------------------------------

    def capture(self) -> None:
        """The iteration as one graph (start-up); where that fails, chains draft eagerly."""
        if not self.capture_wanted:
            return
        start, device, head = time.perf_counter(), self.device, self.head
        head.rope(self.columns[:1], self.capacity)  # the table covers every column first
        self._rope = head._rope_table
        self._pool = dev.graph_pool(device)
        stream = dev.new_stream(device)
        try:
            stream.wait_stream(dev.current_stream(device))
            with torch.inference_mode(), dev.use_stream(device, stream):
                for _ in range(2):
                    self._reset()
                    self.iteration()
            dev.current_stream(device).wait_stream(stream)
            self._reset()
            graph = dev.new_graph(device)
            with torch.inference_mode(), dev.capture(device, graph, self._pool, stream):
                self.iteration()
            self.graph = graph
        except Exception:  # noqa: BLE001 - chains draft eagerly, logged
            log.exception("capturing the EAGLE chain iteration failed; chains draft eagerly")
        dev.synchronize(device)
        if self.graph is not None:
            log.info("captured the EAGLE chain iteration (capacity %d, k up to %d) in %.2f s",
                     self.capacity, self.max_k, time.perf_counter() - start)

    def _reset(self) -> None:
        self.col.zero_()
        self.j.zero_()

    # -- a chain ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def chain(self, seq: EagleSequence, k: int) -> list[int]:
        """A greedy chain of k target ids from the sequence's root (serves() must hold): the
        tokens EagleSequence.chain drafts, one host read."""
        n = seq.length
        self.keys[:, :, :n].copy_(seq.keys[:, :, :n])
        self.values[:, :, :n].copy_(seq.values[:, :, :n])
        self.hidden.copy_(seq.root_out)
        self.logits.copy_(seq.root_logits)
        self.col.fill_(n)
        self.j.zero_()
        for _ in range(k - 1):
            self._run()
        last = self.head.target_ids(self.logits.argmax(-1, keepdim=True))
        self.tokens.index_copy_(0, self.j, last)
        (tokens,), _ = self.fetch([self.tokens[:k]])
        return tokens.tolist()


def visible_columns(columns: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """What the row fed at column `col` [1] sees: every column up to its own. [1, 1, 1, C]"""
    return (columns <= col)[None, None, None]
