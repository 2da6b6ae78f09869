"""The draft model's drafting loop (greedy and sampled rows) over a fixed-size cache, replayed
as device graphs.

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
the width-W graph and k - 1 replays of the width-1 one, one copy out.

Batches with sampled rows replay a second set of graphs, which also choose each row's token as
the eager loop's chooser does (proposer_service/sampling.py, `choose_static`), from
fixed-shape inputs copied in with the rest: every row's temperature, top-k, top-p and min-p
(temperature 0: a greedy row), whether it is seeded, its noise keys for every iteration, and
Exp(1) noise for the unseeded rows drawn on the device before the first replay. A seeded row's
noise is a function of (seed, position) computed at the chosen ids inside the graph, so it
drafts exactly what the eager loop drafts; the truncated q of every row and iteration comes
back with the tokens. Greedy-only batches keep the greedy graphs (no sampling work).

The sequences' own caches stay theirs (proposer_service/draft/cache.py): their columns are
copied into the batch rows before the replays and out again after, device copies. On a device
without graphs the same iterations run eagerly (what the tests compare with the plain loop);
the proposer uses this path only where graphs are captured.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import torch
import torch.nn.functional as F

from kernels.sampling import key_halves
from proposer_service.draft.cache import KV
from proposer_service.draft.loop import ALTERNATIVES
from proposer_service.sampling import Row, choose_static, draft_keys, sparse_row
from splitspec import device as dev
from splitspec.graphs import powers_up_to
from splitspec.lean_llama import LeanDecoder
from splitspec.params import SamplingParams

log = logging.getLogger(__name__)


class DraftGraphs:
    def __init__(self, lean: LeanDecoder, device: torch.device, capacity: int, max_batch: int,
                 max_k: int, widths: tuple[int, ...] = (1, 2), capture: bool = True,
                 top_k: int = 32):
        """capacity: cache columns per row (longer sequences draft eagerly); max_batch: rows;
        max_k: drafted tokens per step at most; widths: iteration-0 input widths served;
        top_k: K of a sampled draft's truncated q (the proposer's --draft-top-k)."""
        self.lean, self.device = lean, device
        self.capacity, self.max_k = capacity, max_k
        self.top_k = min(top_k, lean.vocab_size)
        self.widths = tuple(sorted(set(widths) | {1}))
        self.buckets = powers_up_to(max_batch)
        self.capture_wanted = capture and dev.supports_graphs(device)
        b, dtype = self.buckets[-1], lean.embed.dtype
        shape = (b, lean.n_kv, capacity, lean.head_dim)
        self.cache: KV = [(torch.zeros(shape, dtype=dtype, device=device),
                           torch.zeros(shape, dtype=dtype, device=device))
                          for _ in lean.layers]
        w = max(self.widths)
        # int64 inputs in one buffer: ids, pos [B, W]; lengths, n_new, last, d1_pos [B]; j [1];
        # for sampled rows top_k, keyed [B] and noise keys halves [k_max, B, 2]; float32 ones in
        # another: temperature, top_p, min_p [B]
        self._layout = [("ids", (b, w)), ("pos", (b, w)), ("lengths", (b,)), ("n_new", (b,)),
                        ("last", (b,)), ("d1_pos", (b,)), ("j", (1,)), ("top_k", (b,)),
                        ("keyed", (b,)), ("halves", (max_k, b, 2))]
        self._float_layout = [("temperature", (b,)), ("top_p", (b,)), ("min_p", (b,))]
        total = sum(_numel(s) for _, s in self._layout)
        floats = sum(_numel(s) for _, s in self._float_layout)
        self._host = dev.pinned_empty(total, torch.int64, device)
        self._static = torch.zeros(total, dtype=torch.int64, device=device)
        self._host_f = dev.pinned_empty(floats, torch.float32, device)
        self._static_f = torch.zeros(floats, dtype=torch.float32, device=device)
        self.inputs = {**_split(self._static, self._layout),
                       **_split(self._static_f, self._float_layout)}
        self.host_inputs = {**_split(self._host, self._layout),
                            **_split(self._host_f, self._float_layout)}
        # the unseeded rows' Exp(1) noise per iteration, drawn on the device before a replay
        self.noise = torch.ones(max_k, b, self.top_k, dtype=torch.float32, device=device)
        self.inputs["noise"] = self.noise
        self.tokens = torch.zeros(b, max_k, dtype=torch.int64, device=device)
        # sampled rows' truncated q per iteration: token ids and probabilities [B, k_max, K]
        self.q_ids = torch.zeros(b, max_k, self.top_k, dtype=torch.int64, device=device)
        self.q_probs = torch.zeros(b, max_k, self.top_k, dtype=torch.float32, device=device)
        self.alt_ids = torch.zeros(b, max_k, ALTERNATIVES, dtype=torch.int64, device=device)
        self.alt_probs = torch.zeros(b, max_k, ALTERNATIVES, dtype=torch.float32, device=device)
        self._graphs: dict[tuple[int, int, bool], object] = {}
        self._pool = None
        self.fetch = dev.HostFetch(device)

    # -- what fits ---------------------------------------------------------------------------

    def serves(self, batch: int, width: int, longest_cached: int, k: int) -> bool:
        """Whether a step of `batch` rows with iteration-0 width `width` (the most tokens a row
        has not cached), its longest cache `longest_cached` columns, drafting k tokens, runs
        here: every column it writes fits the capacity."""
        return not self.why_not(batch, width, longest_cached, k)

    def why_not(self, batch: int, width: int, longest_cached: int, k: int) -> str:
        """Why such a step does not run here ("": it does; see `serves`)."""
        if batch > self.buckets[-1]:
            return "batch"
        if width not in self.widths:
            return "width"
        if not 0 < k <= self.max_k:
            return "k"
        if longest_cached + width + k > self.capacity:
            return "context"
        return ""

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def bucket(self, batch: int) -> int:
        return next(b for b in self.buckets if b >= batch)

    # -- one iteration (what a graph records) -------------------------------------------------

    def iteration(self, b: int, width: int, sampled: bool = False) -> None:
        """One drafted token for rows [0, b) from inputs of width `width`, all in place;
        sampled: rows choose by their sampling inputs (else argmax for all)."""
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
        at = x["j"].expand(b)[:, None]  # [b, 1]: this iteration's output column
        if sampled:
            rows = {name: x[name][:b] for name in ("temperature", "top_k", "top_p", "min_p",
                                                  "keyed")}
            halves = x["halves"].index_select(0, x["j"])[0, :b]  # [b, 2]: this position's
            noise = self.noise.index_select(0, x["j"])[0, :b]  # [b, K]
            token, q_ids, q_probs = choose_static(logits, rows, halves, noise, self.top_k)
            wide = at[:, :, None].expand(b, 1, self.top_k)
            self.q_ids[:b].scatter_(1, wide, q_ids[:, None])
            self.q_probs[:b].scatter_(1, wide, q_probs[:, None])
        else:
            token = logits.argmax(dim=-1)
        top = logits.softmax(dim=-1).topk(ALTERNATIVES, dim=-1)
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

    def _run(self, b: int, width: int, sampled: bool) -> None:
        graph = self._graphs.get((b, width, sampled))
        if graph is not None:
            graph.replay()
        else:
            self.iteration(b, width, sampled)

    # -- capture -------------------------------------------------------------------------------

    def capture(self) -> None:
        """One graph per (bucket, width, greedy or sampled), largest first, in one pool
        (start-up)."""
        if not self.capture_wanted:
            return
        start, device = time.perf_counter(), self.device
        self._pool = dev.graph_pool(device)
        stream = dev.new_stream(device)
        shapes = [(b, width, sampled) for b in reversed(self.buckets) for width in self.widths
                  for sampled in (False, True)]
        for shape in shapes:
            try:
                stream.wait_stream(dev.current_stream(device))
                with torch.inference_mode(), dev.use_stream(device, stream):
                    for _ in range(2):
                        self._reset_on_device(shape[0])
                        self.iteration(*shape)
                dev.current_stream(device).wait_stream(stream)
                self._reset_on_device(shape[0])
                graph = dev.new_graph(device)
                with torch.inference_mode(), dev.capture(device, graph, self._pool, stream):
                    self.iteration(*shape)
                self._graphs[shape] = graph
            except Exception:  # noqa: BLE001 - that shape drafts eagerly, logged
                log.exception("capturing the draft loop for %d rows, width %d, %s failed",
                              shape[0], shape[1], "sampled" if shape[2] else "greedy")
        dev.synchronize(device)
        log.info("captured %d draft-loop graphs (batch %s, widths %s, greedy and sampled) in "
                 "%.1f s", len(self._graphs), self.buckets, self.widths,
                 time.perf_counter() - start)

    def _reset_on_device(self, b: int) -> None:
        x = self.inputs
        for name in ("ids", "pos", "lengths", "last", "d1_pos", "j", "top_k", "keyed",
                     "halves", "temperature", "top_p", "min_p"):
            x[name].zero_()
        x["n_new"].fill_(1)
        x["top_p"].fill_(1.0)

    # -- a step ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def draft(self, kvs: list[KV | None], lens: list[int], pending: list[list[int]],
              first_pos: list[int], k: int, params: Sequence[SamplingParams] | None = None
              ) -> tuple[list[list[int]], list[list[tuple[list[int], list[float]]]], list[KV],
                         list[list[Row] | None]]:
        """k tokens per row after each row's cache kvs[i] (lens[i] columns) and its pending
        tokens, each row drafting as its params say (None: all greedy). Returns per row its
        tokens, its alternatives per token, its cache extended by the pending tokens and
        d1 .. d_{k-1} (new tensors), and the sparse q of each token (None: a greedy row)."""
        n, width = len(kvs), max(len(p) for p in pending)
        b = self.bucket(n)
        sampled = params is not None and not all(p.greedy for p in params)
        h = self.host_inputs
        self._host.zero_()
        self._host_f.zero_()
        h["n_new"].fill_(1)
        for i, (p, n_cached, d1) in enumerate(zip(pending, lens, first_pos)):
            h["ids"][i, :len(p)] = torch.tensor(p)
            h["pos"][i, :len(p)] = torch.arange(n_cached, n_cached + len(p))
            h["lengths"][i], h["n_new"][i], h["last"][i] = n_cached, len(p), len(p) - 1
            h["d1_pos"][i] = d1
        if sampled:
            self._sampling_inputs(params, first_pos, k)
        self._static.copy_(self._host, non_blocking=True)
        if sampled:
            self._static_f.copy_(self._host_f, non_blocking=True)
            self.noise[:k, :b].uniform_().log_().neg_()  # Exp(1), as draw_exponentials
        for i, (kv, n_cached) in enumerate(zip(kvs, lens)):  # each row's cache into its row
            if kv is not None and n_cached:
                for (kb, vb), (k_, v_) in zip(self.cache, kv):
                    kb[i, :, :n_cached].copy_(k_[0, :, :n_cached])
                    vb[i, :, :n_cached].copy_(v_[0, :, :n_cached])
        self._run(b, width, sampled)
        for _ in range(k - 1):
            self._run(b, 1, sampled)
        ints = [self.tokens[:n, :k], self.alt_ids[:n, :k]]
        floats = [self.alt_probs[:n, :k]]
        if sampled:
            ints.append(self.q_ids[:n, :k])
            floats.append(self.q_probs[:n, :k])
        (tok, alt_i, *q_i), (alt_p, *q_p) = self.fetch(ints, floats)
        tokens = tok.tolist()
        alt_i, alt_p = alt_i.tolist(), alt_p.tolist()
        alternatives = [[(alt_i[i][j], alt_p[i][j]) for j in range(k)] for i in range(n)]
        dists: list[list[Row] | None] = [None] * n
        if sampled:
            q_i, q_p = q_i[0].tolist(), q_p[0].tolist()
            for i, p in enumerate(params):
                if not p.greedy:
                    dists[i] = [sparse_row(q_i[i][j], q_p[i][j]) for j in range(k)]
        new_kvs = []
        for i, (n_cached, p) in enumerate(zip(lens, pending)):
            end = n_cached + len(p) + k - 1  # cached + pending + d1 .. d_{k-1}
            new_kvs.append([(kb[i:i + 1, :, :end].clone(), vb[i:i + 1, :, :end].clone())
                            for kb, vb in self.cache])
        return tokens, alternatives, new_kvs, dists

    def _sampling_inputs(self, params: Sequence[SamplingParams], first_pos: list[int],
                         k: int) -> None:
        """Each row's sampling parameters and, for seeded rows, the noise keys of its k draft
        positions, into the host inputs (rows beyond the batch stay greedy)."""
        h = self.host_inputs
        h["top_p"].fill_(1.0)
        for i, p in enumerate(params):
            if p.greedy:
                continue
            h["temperature"][i], h["top_k"][i] = p.temperature, p.top_k
            h["top_p"][i], h["min_p"][i] = p.top_p, p.min_p
        for j in range(k):
            for i, key in enumerate(draft_keys(params, [d1 + j for d1 in first_pos])):
                if key is not None:
                    h["keyed"][i] = 1
                    h["halves"][j, i] = key_halves([key])[0]


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
