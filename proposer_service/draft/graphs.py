"""The draft model's drafting loop (greedy and sampled rows) over a fixed-size cache, replayed
as device graphs.

On an accelerator each drafted token of a small draft costs a hundred eager launches, most of a
step's time. Here the loop runs over static buffers instead:

    cache         the resident cache (proposer_service/draft/slots.py): per layer K, V
                  [slots + scratch, capacity, H_kv, D], a batch row addressing its sequence's
                  slot, or a borrowed scratch row for a cache that lives elsewhere
    inputs        ids, pos [B, W] (iteration 0: each row's not-yet-cached tokens, right-padded
                  to W; later iterations: the last drafted token), lengths [B] (columns cached),
                  n_new [B] (real tokens among the W), last [B] (the column read for logits),
                  d1_pos [B] (position of each row's first draft token), slot [B] (the cache row
                  each batch row reads and writes), j (iteration)
    outputs       tokens [B, k_max], the draft's top-A alternatives and their probabilities

and one iteration is one graph per (batch bucket B, width W): it writes the new keys and values
at each row's own columns of its slot (lengths + s, on the device), attends through
kernels/paged_attention.py (one block of `capacity` columns per slot; on an accelerator the
Triton kernel, which reads only each row's columns up to its length, a bound it loads on the
device), takes the argmax and the top-A, writes them at column j of the outputs, and feeds the
token back (ids, pos, lengths, j updated in place). A step is one copy of the inputs in, one
replay of the width-W graph and k - 1 replays of the width-1 one, one copy of the drafts out; for
the k values asked for (`chain_ks`: the proposer's --draft-graph-chain-k) the whole loop is also
captured as one graph per bucket, width and kind, replayed once per step.

Batches with sampled rows replay a second set of graphs, which also choose each row's token as
the eager loop's chooser does (proposer_service/sampling.py, `choose_static`), from
fixed-shape inputs copied in with the rest: every row's temperature, top-k, top-p and min-p
(temperature 0: a greedy row), whether it is seeded, its noise keys for every iteration, and
Exp(1) noise for the unseeded rows drawn on the device before the first replay. A seeded row's
noise is a function of (seed, position) computed at the chosen ids inside the graph, so it
drafts exactly what the eager loop drafts; the truncated q of every row and iteration comes
back with the tokens. Greedy-only batches keep the greedy graphs (no sampling work).

A sequence that owns a slot is drafted in it: no cache copied in or out, its pending tokens and
drafts written past its length in place (rollback next step is a length change). A cache that
lives elsewhere (a sequence without a slot, the prefixes a token tree's leaves grow from) is
copied into a borrowed scratch row before the replays and out again after, device copies;
batch rows past the step's sequences (the bucket's padding) write a scratch row of their own.
On a device without graphs the same iterations run eagerly (what the tests compare with the
plain loop); the proposer uses this path only where graphs are captured.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import torch

from kernels.paged_attention import paged_attention
from kernels.sampling import key_halves
from proposer_service.draft.cache import KV
from proposer_service.draft.loop import ALTERNATIVES
from proposer_service.draft.slots import DraftSlots
from proposer_service.sampling import Row, choose_static, draft_keys, sparse_row
from splitspec import device as dev
from splitspec.graphs import powers_up_to
from splitspec.lean_llama import LeanDecoder
from splitspec.params import SamplingParams

log = logging.getLogger(__name__)


class DraftGraphs:
    def __init__(self, lean: LeanDecoder, device: torch.device, capacity: int, max_batch: int,
                 max_k: int, widths: tuple[int, ...] = (1, 2), capture: bool = True,
                 top_k: int = 32, slots: DraftSlots | None = None, chain_ks: tuple[int, ...] = ()):
        """capacity: cache columns per row (longer sequences draft eagerly); max_batch: rows;
        max_k: drafted tokens per step at most; widths: iteration-0 input widths served;
        top_k: K of a sampled draft's truncated q (the proposer's --draft-top-k); slots: the
        resident cache the loop runs over (its capacity, and at least scratch_rows(max_batch)
        scratch rows; None: a cache of scratch rows of its own); chain_ks: k values whose whole
        loop (the width-W iteration and k - 1 width-1 ones) is also captured as one graph per
        bucket, width and kind, replayed once per step instead of k times."""
        self.lean, self.device = lean, device
        self.capacity, self.max_k = capacity, max_k
        self.top_k = min(top_k, lean.vocab_size)
        self.widths = tuple(sorted(set(widths) | {1}))
        self.chain_ks = tuple(sorted(k for k in set(chain_ks) if 1 < k <= max_k))
        self.buckets = powers_up_to(max_batch)
        self.capture_wanted = capture and dev.supports_graphs(device)
        b = self.buckets[-1]
        self.slots = slots or DraftSlots(lean, device, 0, capacity, scratch_rows(max_batch))
        assert self.slots.capacity == capacity and self.slots.scratch >= scratch_rows(max_batch)
        # borrowed rows (caches that live elsewhere, copied in) and the padding rows' own
        first = self.slots.slots
        self.borrowed = list(range(first, first + b))
        self.padding_row = first + self.slots.scratch - 1
        w = max(self.widths)
        # int64 inputs in one buffer: ids, pos [B, W]; lengths, n_new, last, d1_pos, slot [B];
        # j [1]; for sampled rows top_k, keyed [B] and noise keys halves [k_max, B, 2]; float32
        # ones in another: temperature, top_p, min_p [B]
        self._layout = [("ids", (b, w)), ("pos", (b, w)), ("lengths", (b,)), ("n_new", (b,)),
                        ("last", (b,)), ("d1_pos", (b,)), ("slot", (b,)), ("j", (1,)),
                        ("top_k", (b,)), ("keyed", (b,)), ("halves", (max_k, b, 2))]
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
        slot = x["slot"][:b]
        lean, cap, dev_ = self.lean, self.capacity, self.device
        cols = lengths[:, None] + torch.arange(width, device=dev_)  # [b, W]
        # each query's column in the flat cache (a slot's columns one after the other); a
        # padding query writes past its row's length, where the next real token overwrites it
        flat = (slot[:, None] * cap + cols.clamp(max=cap - 1)).reshape(-1)  # [b * W]
        # a query sees its row's columns up to its own (paged attention's causal rows)
        packed = torch.arange(b * width, device=dev_)
        first_node = torch.full((b,), width, dtype=torch.int64, device=dev_)
        bits = torch.zeros(b * width, dtype=torch.int64, device=dev_)
        tables = slot[:, None]  # [b, 1]: one block of `cap` columns per slot
        shape = (-1, lean.n_kv, lean.head_dim)

        def attend(i, q, k, v):
            kb, vb = self.slots.kv[i]
            kf, vf = kb.view(shape), vb.view(shape)  # [rows * cap, H_kv, D]
            kf.index_copy_(0, flat, k.transpose(1, 2).reshape(shape).to(kf.dtype))
            vf.index_copy_(0, flat, v.transpose(1, 2).reshape(shape).to(vf.dtype))
            att = paged_attention(q.transpose(1, 2).reshape(b * width, lean.n_heads, -1), kf,
                                  vf, tables, cap, lengths, lengths + width, packed, width,
                                  first_node, bits, lean.scale)  # [b * W, Hq, D]
            return att.reshape(b, width, -1)

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

    def _loop(self, b: int, width: int, sampled: bool, k: int) -> None:
        """A step's k iterations: one replay of its captured chain, else k replays (or eager
        iterations)."""
        chain = self._graphs.get((b, width, sampled, k))
        if chain is not None:
            chain.replay()
            return
        self._run(b, width, sampled)
        for _ in range(k - 1):
            self._run(b, 1, sampled)

    def _body(self, shape: tuple) -> None:
        """What the graph of a shape records: one iteration, or a chain's k of them."""
        b, width, sampled, *chain = shape
        self.iteration(b, width, sampled)
        for _ in range(chain[0] - 1 if chain else 0):
            self.iteration(b, 1, sampled)

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
        shapes += [shape + (k,) for shape in shapes for k in self.chain_ks]
        for shape in shapes:
            try:
                stream.wait_stream(dev.current_stream(device))
                with torch.inference_mode(), dev.use_stream(device, stream):
                    for _ in range(2):
                        self._reset_on_device(shape[0])
                        self._body(shape)
                dev.current_stream(device).wait_stream(stream)
                self._reset_on_device(shape[0])
                graph = dev.new_graph(device)
                with torch.inference_mode(), dev.capture(device, graph, self._pool, stream):
                    self._body(shape)
                self._graphs[shape] = graph
            except Exception:  # noqa: BLE001 - that shape drafts eagerly, logged
                log.exception("capturing the draft loop for %d rows, width %d, %s failed",
                              shape[0], shape[1], "sampled" if shape[2] else "greedy")
        dev.synchronize(device)
        log.info("captured %d draft-loop graphs (batch %s, widths %s, greedy and sampled, "
                 "whole loops for k %s) in %.1f s", len(self._graphs), self.buckets, self.widths,
                 list(self.chain_ks), time.perf_counter() - start)

    def _reset_on_device(self, b: int) -> None:
        x = self.inputs
        for name in ("ids", "pos", "lengths", "last", "d1_pos", "j", "top_k", "keyed",
                     "halves", "temperature", "top_p", "min_p"):
            x[name].zero_()
        x["n_new"].fill_(1)
        x["top_p"].fill_(1.0)
        x["slot"].fill_(self.padding_row)

    # -- a step ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def draft(self, kvs: list[KV | None], lens: list[int], pending: list[list[int]],
              first_pos: list[int], k: int, params: Sequence[SamplingParams] | None = None,
              slots: list[int | None] | None = None
              ) -> tuple[list[list[int]], list[list[tuple[list[int], list[float]]]],
                         list[KV | None], list[list[Row] | None]]:
        """k tokens per row after each row's cache and its pending tokens, each row drafting as
        its params say (None: all greedy). A row's cache is its slot slots[i] of the resident
        cache (lens[i] columns; the pending tokens and drafts are written there in place), or
        where it has none (slots None, or slots[i] None) kvs[i], copied into a borrowed row.
        Returns per row its tokens, its alternatives per token, for a borrowed row its cache
        extended by the pending tokens and d1 .. d_{k-1} (new tensors; None for a slot's row,
        whose slot holds them), and the sparse q of each token (None: a greedy row)."""
        n, width = len(kvs), max(len(p) for p in pending)
        b = self.bucket(n)
        slots = list(slots) if slots is not None else [None] * n
        borrowed = iter(self.borrowed)
        rows = [s if s is not None else next(borrowed) for s in slots]
        sampled = params is not None and not all(p.greedy for p in params)
        h = self.host_inputs
        self._host.zero_()
        self._host_f.zero_()
        h["n_new"].fill_(1)
        h["slot"].fill_(self.padding_row)
        for i, (p, n_cached, d1) in enumerate(zip(pending, lens, first_pos)):
            h["ids"][i, :len(p)] = torch.tensor(p)
            h["pos"][i, :len(p)] = torch.arange(n_cached, n_cached + len(p))
            h["lengths"][i], h["n_new"][i], h["last"][i] = n_cached, len(p), len(p) - 1
            h["d1_pos"][i], h["slot"][i] = d1, rows[i]
        if sampled:
            self._sampling_inputs(params, first_pos, k)
        self._static.copy_(self._host, non_blocking=True)
        if sampled:
            self._static_f.copy_(self._host_f, non_blocking=True)
            self.noise[:k, :b].uniform_().log_().neg_()  # Exp(1), as draw_exponentials
        for i, (kv, n_cached) in enumerate(zip(kvs, lens)):  # a borrowed row's cache in
            if slots[i] is None and kv is not None and n_cached:
                self.slots.write(rows[i], kv, 0, n_cached)
        self._loop(b, width, sampled, k)
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
        new_kvs: list[KV | None] = []
        for i, (n_cached, p) in enumerate(zip(lens, pending)):
            end = n_cached + len(p) + k - 1  # cached + pending + d1 .. d_{k-1}
            new_kvs.append(None if slots[i] is not None else
                           [(kb.clone(), vb.clone()) for kb, vb in self.slots.view(rows[i], end)])
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


def scratch_rows(max_batch: int) -> int:
    """Scratch rows the loop needs: a borrowed row per batch row and one for padding rows."""
    return powers_up_to(max_batch)[-1] + 1


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
