"""The draft model's greedy drafting loop over a fixed-size cache, replayed as device graphs.

On an accelerator each drafted token of a small draft costs a hundred eager launches, most of a
step's time. Here the loop runs over static buffers instead:

    cache         per layer K, V [B_max, H_kv, capacity, D], one row per sequence of the batch
    inputs        ids, pos [B, W] (iteration 0: each row's not-yet-cached tokens, right-padded
                  to W; later iterations: the last drafted token), lengths [B] (columns cached),
                  n_new [B] (real tokens among the W), last [B] (the column read for logits),
                  d1_pos [B] (position of each row's first draft token), j (iteration)
    outputs       tokens [B, k_max], the draft's top-A alternatives and their probabilities

and one iteration is one graph per (batch bucket B, width W): it writes the new keys and values
at each row's own columns (lengths + s, on the device), attends over the whole capacity with a
mask by length, takes the argmax and the top-A, writes them at column j of the outputs, and
feeds the token back (ids, pos, lengths, j updated in place). A step is one copy in, one replay of
the width-W graph and k - 1 replays of the width-1 one, one copy out. Greedy rows only: sampled
drafts keep the eager loop (their chooser's parameters vary per step).

The sequences' own caches stay theirs (proposer_service/draft_cache.py): their columns are
copied into the batch rows before the replays and out again after, device copies. On a device
without graphs the same iterations run eagerly (what the tests compare with the plain loop);
the proposer uses this path only where graphs are captured.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F

from proposer_service.draft_cache import KV
from proposer_service.draft_loop import ALTERNATIVES
from splitspec import device as dev
from splitspec.graphs import powers_up_to
from splitspec.lean_llama import LeanDecoder

log = logging.getLogger(__name__)


class DraftGraphs:
    def __init__(self, lean: LeanDecoder, device: torch.device, capacity: int, max_batch: int,
                 max_k: int, widths: tuple[int, ...] = (1, 2), capture: bool = True):
        """capacity: cache columns per row (longer sequences draft eagerly); max_batch: rows;
        max_k: drafted tokens per step at most; widths: iteration-0 input widths served."""
        self.lean, self.device = lean, device
        self.capacity, self.max_k = capacity, max_k
        self.widths = tuple(sorted(set(widths) | {1}))
        self.buckets = powers_up_to(max_batch)
        self.capture_wanted = capture and dev.supports_graphs(device)
        b, dtype = self.buckets[-1], lean.embed.dtype
        shape = (b, lean.n_kv, capacity, lean.head_dim)
        self.cache: KV = [(torch.zeros(shape, dtype=dtype, device=device),
                           torch.zeros(shape, dtype=dtype, device=device))
                          for _ in lean.layers]
        w = max(self.widths)
        # int64 inputs in one buffer: ids, pos [B, W]; lengths, n_new, last, d1_pos [B]; j [1]
        self._layout = [("ids", (b, w)), ("pos", (b, w)), ("lengths", (b,)), ("n_new", (b,)),
                        ("last", (b,)), ("d1_pos", (b,)), ("j", (1,))]
        total = sum(_numel(s) for _, s in self._layout)
        self._host = dev.pinned_empty(total, torch.int64, device)
        self._static = torch.zeros(total, dtype=torch.int64, device=device)
        self.inputs = _split(self._static, self._layout)
        self.host_inputs = _split(self._host, self._layout)
        self.tokens = torch.zeros(b, max_k, dtype=torch.int64, device=device)
        self.alt_ids = torch.zeros(b, max_k, ALTERNATIVES, dtype=torch.int64, device=device)
        self.alt_probs = torch.zeros(b, max_k, ALTERNATIVES, dtype=torch.float32, device=device)
        self._graphs: dict[tuple[int, int], object] = {}
        self._pool = None
        self.fetch = dev.HostFetch(device)

    # -- what fits ---------------------------------------------------------------------------

    def serves(self, batch: int, width: int, longest_cached: int, k: int) -> bool:
        """Whether a step of `batch` rows with iteration-0 width `width` (the most tokens a row
        has not cached), its longest cache `longest_cached` columns, drafting k tokens, runs
        here: every column it writes fits the capacity."""
        return (batch <= self.buckets[-1] and width in self.widths and 0 < k <= self.max_k
                and longest_cached + width + k <= self.capacity)

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def bucket(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    # -- one iteration (what a graph records) -------------------------------------------------

    def iteration(self, b: int, width: int) -> None:
        """One drafted token for rows [0, b) from inputs of width `width`, all in place."""
        x = self.inputs
        ids, pos = x["ids"][:b, :width], x["pos"][:b, :width]
        lengths, n_new, last = x["lengths"][:b], x["n_new"][:b], x["last"][:b]
        lean, cap = self.lean, self.capacity
        cols = lengths[:, None] + torch.arange(width, device=self.device)  # [b, W]
        # a query sees the columns up to its own; padding queries read their row harmlessly
        mask = (torch.arange(cap, device=self.device) <= cols[:, :, None])[:, None]
        groups = lean.n_heads // lean.n_kv
        index = cols.clamp(max=cap - 1)[:, None, :, None].expand(
            b, lean.n_kv, width, lean.head_dim)

        def attend(i, q, k, v):
            kb, vb = self.cache[i]
            kb, vb = kb[:b], vb[:b]
            kb.scatter_(2, index, k.to(kb.dtype))
            vb.scatter_(2, index, v.to(vb.dtype))
            att = F.scaled_dot_product_attention(q, kb.to(q.dtype), vb.to(q.dtype),
                                                 attn_mask=mask, scale=lean.scale,
                                                 enable_gqa=groups > 1)
            return att.transpose(1, 2).reshape(b, width, -1)

        hidden = lean.hidden(ids, pos, attend)  # [b, W, H]
        row = hidden.gather(1, last[:, None, None].expand(b, 1, hidden.shape[-1]))[:, 0]
        logits = lean.head(row).float()  # [b, V]
        token = logits.argmax(dim=-1)
        top = logits.softmax(dim=-1).topk(ALTERNATIVES, dim=-1)
        at = x["j"].expand(b)[:, None]  # [b, 1]: this iteration's output column
        self.tokens[:b].scatter_(1, at, token[:, None])
        self.alt_ids[:b].scatter_(1, at[:, :, None].expand(b, 1, ALTERNATIVES),
                                  top.indices[:, None])
        self.alt_probs[:b].scatter_(1, at[:, :, None].expand(b, 1, ALTERNATIVES),
                                    top.values[:, None])
        # feed the token back: next input d_{j+1} at position d1_pos + j
        lengths.add_(n_new)
        n_new.fill_(1)
        last.zero_()
        x["ids"][:b, 0] = token
        x["pos"][:b, 0] = x["d1_pos"][:b] + x["j"]
        x["j"].add_(1)

    def _run(self, b: int, width: int) -> None:
        graph = self._graphs.get((b, width))
        if graph is not None:
            graph.replay()
        else:
            self.iteration(b, width)

    # -- capture -------------------------------------------------------------------------------

    def capture(self) -> None:
        """One graph per (bucket, width), largest first, in one pool (start-up)."""
        if not self.capture_wanted:
            return
        start, device = time.perf_counter(), self.device
        self._pool = dev.graph_pool(device)
        stream = dev.new_stream(device)
        for b in reversed(self.buckets):
            for width in self.widths:
                try:
                    stream.wait_stream(dev.current_stream(device))
                    with torch.inference_mode(), dev.use_stream(device, stream):
                        for _ in range(2):
                            self._reset_on_device(b)
                            self.iteration(b, width)
                    dev.current_stream(device).wait_stream(stream)
                    self._reset_on_device(b)
                    graph = dev.new_graph(device)
                    with torch.inference_mode(), dev.capture(device, graph, self._pool, stream):
                        self.iteration(b, width)
                    self._graphs[(b, width)] = graph
                except Exception:  # noqa: BLE001 - that shape drafts eagerly, logged
                    log.exception("capturing the draft loop for %d rows, width %d failed",
                                  b, width)
        dev.synchronize(device)
        log.info("captured %d draft-loop graphs (batch %s, widths %s) in %.1f s",
                 len(self._graphs), self.buckets, self.widths, time.perf_counter() - start)

    def _reset_on_device(self, b: int) -> None:
        x = self.inputs
        for name in ("ids", "pos", "lengths", "last", "d1_pos", "j"):
            x[name].zero_()
        x["n_new"].fill_(1)

    # -- a step ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def draft(self, kvs: list[KV | None], lens: list[int], pending: list[list[int]],
              first_pos: list[int], k: int
              ) -> tuple[list[list[int]], list[list[tuple[list[int], list[float]]]], list[KV]]:
        """Greedy k tokens per row after each row's cache kvs[i] (lens[i] columns) and its
        pending tokens. Returns per row its tokens, its alternatives per token, and its cache
        extended by the pending tokens and d1 .. d_{k-1} (new tensors)."""
        n, width = len(kvs), max(len(p) for p in pending)
        b = self.bucket(n)
        h = self.host_inputs
        self._host.zero_()
        h["n_new"].fill_(1)
        for i, (p, n_cached, d1) in enumerate(zip(pending, lens, first_pos)):
            h["ids"][i, :len(p)] = torch.tensor(p)
            h["pos"][i, :len(p)] = torch.arange(n_cached, n_cached + len(p))
            h["lengths"][i], h["n_new"][i], h["last"][i] = n_cached, len(p), len(p) - 1
            h["d1_pos"][i] = d1
        self._static.copy_(self._host, non_blocking=True)
        for i, (kv, n_cached) in enumerate(zip(kvs, lens)):  # each row's cache into its row
            if kv is not None and n_cached:
                for (kb, vb), (k_, v_) in zip(self.cache, kv):
                    kb[i, :, :n_cached].copy_(k_[0, :, :n_cached])
                    vb[i, :, :n_cached].copy_(v_[0, :, :n_cached])
        self._run(b, width)
        for _ in range(k - 1):
            self._run(b, 1)
        (tok, alt_i), (alt_p,) = self.fetch([self.tokens[:n, :k], self.alt_ids[:n, :k]],
                                             [self.alt_probs[:n, :k]])
        tokens = tok.tolist()
        alt_i, alt_p = alt_i.tolist(), alt_p.tolist()
        alternatives = [[(alt_i[i][j], alt_p[i][j]) for j in range(k)] for i in range(n)]
        new_kvs = []
        for i, (n_cached, p) in enumerate(zip(lens, pending)):
            end = n_cached + len(p) + k - 1  # cached + pending + d1 .. d_{k-1}
            new_kvs.append([(kb[i:i + 1, :, :end].clone(), vb[i:i + 1, :, :end].clone())
                            for kb, vb in self.cache])
        return tokens, alternatives, new_kvs


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _split(flat: torch.Tensor, layout) -> dict[str, torch.Tensor]:
    out, at = {}, 0
    for name, shape in layout:
        n = _numel(shape)
        out[name] = flat[at:at + n].view(shape)
        at += n
    return out
