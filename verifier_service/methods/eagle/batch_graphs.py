"""A step's EAGLE work over several sequences at once, replayed as captured graphs per batch
bucket: their greedy and sampled chains and their advances over the kept rows (the batched
forms of verifier_service/methods/eagle/graphs.py's chains and advance).

Where the device captures graphs, a lone sequence's chain and advance replay its own graphs; a
step of B sequences replayed B x (k - 1) chain iterations and B advances, each a few dozen
kernels of a row or a few. Here the step's sequences share one static cache and one replay per
drafted level, and one replay for their advance:

    keys, values  [B_max, kv_heads, capacity, head_dim]: row i holds sequence i's columns
                  (copied in, device to device, before the replays) and the rows being written
    hidden, logits  [B_max, H], [B_max, Vd]: each row's predictor of its next token (the roots,
                  then each fed token's output)
    col [B_max]   the column each row's next fed token is written at (its position); padding
                  rows start at 0 and write only their own row
    j [1]         the drafted level, tokens [B_max, max_k] the drafted target ids
    feats, next_ids  [B_max, W_max, F], [B_max, W_max]: an advance's rows per sequence (the
                  target's features and the tokens after them), padded to the step's width
    start, last   [B_max]: each row's first column, and the index of its last real row

The chain iteration for bucket b takes the argmax of each row's logits as its token j, feeds it
at the row's own column (keys and values scattered there, attention over the capacity masked to
the columns up to it), and leaves the outputs and logits in place; col and j move on. A step's
chains are one copy in per sequence, max(k) - 1 replays, one argmax and one copy of the tokens
out of the static buffers; the tokens stay on the device (greedy chains are fed to the step
from there, verifier_service/methods/in_target.py DeviceDraft). A sequence asking fewer than max(k)
tokens takes the first of its row.

A step's sampled chains replay a second iteration per bucket that picks each row's token j as
head.sampled_chain_many does: the row's own temperature, top-k, top-p and min-p (copied
in once per step, [B_max] each) over its logits, its top-K truncated q, and the exponential
race over that q with the keyed noise of the token's position (a seeded row: keys [B_max,
max_k, 2] computed on the host, the noise at the target ids inside the graph) or Exp(1) noise
drawn on the device before the first replay (an unseeded row: [B_max, max_k, K]); each
token's q row is written beside it ([B_max, max_k, K] ids and probabilities). The last level's
pick replays its own graph (some thirty launches eagerly). Tokens and q rows come back with the
step's other drafts, in one copy.

The advance for (bucket b, width W) feeds each row's W rows at columns start .. start + W - 1
(each seeing the columns up to its own; a sequence's padding rows write columns past its real
ones, which nothing reads), and leaves each row's last real output and its logits in hidden and
logits; the new columns and those roots are copied out into the sequences (what
`EagleSequence.advance` leaves). More sequences than the largest bucket run in groups.

On the CPU they run eagerly over the same buffers (what the tests compare with
head.chain_many and advance_many); the head batches its eager work itself there.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch

from kernels.sampling import (
    apply_sampling_params,
    key_halves,
    keyed_exponentials_at,
    noise_key,
    race,
    truncate,
)
from splitspec import device as dev
from splitspec.graphs import powers_up_to
from splitspec.params import SamplingParams
from verifier_service.methods.eagle.head import EagleHead, EagleSequence, sampling_settings

log = logging.getLogger(__name__)


class EagleBatch:
    def __init__(self, head: EagleHead, capacity: int, max_k: int, max_batch: int,
                 top_k: int = 16):
        """capacity: columns a sequence may reach and draft from; max_k: drafted tokens per
        chain at most (an advance keeps up to 1 + max_k rows: widths are powers of two up to
        that); max_batch: sequences per replay (buckets: powers of two up to it); top_k: K of
        a sampled chain's truncated q."""
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
        # sampled chains: each row's parameters (keyed: 1 when seeded), its noise keys per
        # token, its unseeded noise; out: each token's q row
        self.top_k = min(top_k, width)
        self.sampling = {name: torch.zeros(b, dtype=dtype, device=device) for name, dtype in (
            ("temperature", torch.float32), ("top_k", torch.long), ("top_p", torch.float32),
            ("min_p", torch.float32), ("keyed", torch.long))}
        self.halves = torch.zeros(b, max_k, 2, dtype=torch.long, device=device)
        self.noise = torch.ones(b, max_k, self.top_k, dtype=torch.float32, device=device)
        self.q_ids = torch.zeros(b, max_k, self.top_k, dtype=torch.long, device=device)
        self.q_probs = torch.zeros(b, max_k, self.top_k, dtype=torch.float32, device=device)
        self.columns = torch.arange(capacity, device=device)
        self.widths = powers_up_to(1 + max_k)
        w = self.widths[-1]
        self.feats = torch.zeros(b, w, s.feature_size, dtype=head.dtype, device=device)
        self.next_ids = torch.zeros(b, w, dtype=torch.long, device=device)
        self.start = torch.zeros(b, dtype=torch.long, device=device)
        self.last = torch.zeros(b, dtype=torch.long, device=device)
        self.graphs: dict[int, object] = {}  # the chain iteration per bucket
        self.sampled_graphs: dict[int, object] = {}  # the sampled chain iteration per bucket
        self.pick_graphs: dict[int, object] = {}  # a sampled chain's last pick per bucket
        self.advance_graphs: dict[tuple[int, int], object] = {}  # per (bucket, width)

    @property
    def bytes(self) -> int:
        """Device memory of the static buffers."""
        return sum(t.numel() * t.element_size() for t in (
            self.keys, self.values, self.hidden, self.logits, self.col, self.tokens,
            self.feats, self.next_ids, self.start, self.last, self.halves, self.noise,
            self.q_ids, self.q_probs, *self.sampling.values()))

    @property
    def captured(self) -> bool:
        """Whether a step's chains replay graphs here."""
        return bool(self.graphs)

    @property
    def captured_sampled(self) -> bool:
        """Whether a step's sampled chains replay graphs here."""
        return bool(self.sampled_graphs)

    @property
    def captured_advance(self) -> bool:
        """Whether a step's advances replay graphs here."""
        return bool(self.advance_graphs)

    def width(self, rows: int) -> int:
        return next(w for w in self.widths if w >= rows)

    def serves_advance(self, seq: EagleSequence, rows: int) -> bool:
        """Whether an advance by `rows` rows fits: a width holds them and every column its
        width writes lies within the capacity."""
        return 0 < rows <= self.widths[-1] and seq.length + self.width(rows) <= self.capacity

    def bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def serves(self, seq: EagleSequence, k: int) -> bool:
        """Whether a chain of k from this sequence's root fits (every column it writes,
        length .. length + k - 2, within the capacity)."""
        return 0 < k <= self.max_k and seq.root_out is not None and \
            seq.length + k - 1 <= self.capacity

    # -- one level (what a graph records) ----------------------------------------------------

    def pick(self, b: int, sampled: bool = False) -> torch.Tensor:
        """Each row's token j, written at column j of tokens: the argmax of its logits, or
        (sampled) drawn from its truncated q after its own parameters, its q row written
        beside it. [b] target ids"""
        head = self.head
        if not sampled:
            tok = head.target_ids(self.logits[:b].argmax(-1))  # [b]
        else:
            tok, ids, vals = sampled_pick(
                head, self.logits[:b], {n: t[:b] for n, t in self.sampling.items()},
                self.halves[:b].index_select(1, self.j)[:, 0],
                self.noise[:b].index_select(1, self.j)[:, 0], self.top_k)
            self.q_ids[:b].index_copy_(1, self.j, ids[:, None])
            self.q_probs[:b].index_copy_(1, self.j, vals[:, None])
        self.tokens[:b].index_copy_(1, self.j, tok[:, None])
        return tok

    def iteration(self, b: int, sampled: bool = False) -> None:
        """Rows [0, b): token j picked and fed at each row's column; hidden, logits, col and j
        move on."""
        head, spec = self.head, self.head.spec
        tok = self.pick(b, sampled)
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

    def advance_rows(self, b: int, width: int) -> None:
        """Rows [0, b): their `width` rows fed at columns start .. start + width - 1; each
        row's output at `last` and its logits into hidden and logits."""
        head, spec = self.head, self.head.spec
        pos = self.start[:b, None] + self.columns[:width]  # [b, W]
        mask = causal_columns_rows(self.columns, pos)  # [b, 1, W, C]
        at = pos[:, None, :, None].expand(b, spec.num_kv_heads, width, spec.head_dim)
        keys, values = self.keys[:b], self.values[:b]

        def attend(q, k, v):
            keys.scatter_(2, at, k)
            values.scatter_(2, at, v)
            return head.attention(q, keys, values, mask)

        hidden = head.hidden_from_features(self.feats[:b, :width])  # [b, W, H]
        out = head.layer(self.next_ids[:b, :width], hidden, pos, attend, self.capacity)
        root = out.gather(1, self.last[:b, None, None].expand(b, 1, out.shape[-1]))[:, 0]
        self.hidden[:b].copy_(root)
        self.logits[:b].copy_(head.logits(root))

    def _run(self, b: int, sampled: bool = False) -> None:
        graph = (self.sampled_graphs if sampled else self.graphs).get(b)
        if graph is not None:
            graph.replay()
        else:
            self.iteration(b, sampled)

    def _last_pick(self, b: int, sampled: bool) -> None:
        graph = self.pick_graphs.get(b) if sampled else None
        if graph is not None:
            graph.replay()
        else:
            self.pick(b, sampled)

    # -- capture ---------------------------------------------------------------------------------

    def capture(self, capture_one) -> None:
        """The chain iteration per bucket and the advance per (bucket, width), largest first
        (capture_one(body, what) -> graph or None: EagleGraphs' capture, in its pool and
        stream)."""
        for b in reversed(self.buckets):
            graph = capture_one(lambda b=b: self.iteration(b),
                                f"the chain iteration over {b} sequences")
            if graph is not None:
                self.graphs[b] = graph
            graph = capture_one(lambda b=b: self.iteration(b, True),
                                f"the sampled chain iteration over {b} sequences")
            if graph is not None:
                self.sampled_graphs[b] = graph
            graph = capture_one(lambda b=b: self.pick(b, True),
                                f"the sampled last pick over {b} sequences")
            if graph is not None:
                self.pick_graphs[b] = graph
            for width in reversed(self.widths):
                graph = capture_one(lambda b=b, w=width: self.advance_rows(b, w),
                                    f"the advance of {b} sequences over {width} rows")
                if graph is not None:
                    self.advance_graphs[(b, width)] = graph

    def reset(self) -> None:
        for t in (self.col, self.j, self.start, self.last):
            t.zero_()

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

    def _start(self, seqs: Sequence[EagleSequence]) -> int:
        """Each sequence's columns and root into its row; the bucket that holds them."""
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
        return b

    def _group(self, seqs: Sequence[EagleSequence], k: int) -> torch.Tensor:
        n, b = len(seqs), self._start(seqs)
        for _ in range(k - 1):
            self._run(b)
        self.pick(b)
        return self.tokens[:n, :k].clone()

    @torch.no_grad()
    def sampled_chains(self, seqs: Sequence[EagleSequence], ks: Sequence[int],
                       params: Sequence[SamplingParams], first_positions: Sequence[int]
                       ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Each sequence's sampled chain of ks[i] tokens (serves() must hold for each), as
        (target ids [k], q ids [k, K], q probabilities [k, K]) on the device: a seeded row the
        very tokens head.sampled_chain_many draws with this K, an unseeded one draws from
        the same q."""
        top = self.buckets[-1]
        out: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for at in range(0, len(seqs), top):
            span = slice(at, at + top)
            out += self._sampled_group(seqs[span], ks[span], params[span],
                                       first_positions[span])
        return out

    def _sampled_group(self, seqs, ks, params, first_positions):
        n, k = len(seqs), max(ks)
        b = self.bucket(n)
        pad = [SamplingParams(temperature=1.0)] * (b - n)  # padding rows draw, unread
        for name, values in zip(("temperature", "top_k", "top_p", "min_p"),
                                sampling_settings(list(params) + pad)):
            self.sampling[name][:b].copy_(dev.to_device(values, self.device))
        keyed = [int(p.seed is not None) for p in params] + [0] * (b - n)
        self.sampling["keyed"][:b].copy_(dev.to_device(torch.tensor(keyed), self.device))
        seeded = [i for i, p in enumerate(params) if p.seed is not None]
        if seeded:
            keys = [noise_key(params[i].seed, first_positions[i] + level)
                    for i in seeded for level in range(k)]
            rows = dev.to_device(torch.tensor(seeded), self.device)
            self.halves[:, :k].index_copy_(0, rows, dev.to_device(
                key_halves(keys).view(len(seeded), k, 2), self.device))
        self.noise[:b, :k].uniform_().log_().neg_()  # Exp(1), as draw_exponentials
        self._start(seqs)
        for _ in range(k - 1):
            self._run(b, sampled=True)
        self._last_pick(b, sampled=True)
        tokens, ids, probs = (self.tokens[:n, :k].clone(), self.q_ids[:n, :k].clone(),
                              self.q_probs[:n, :k].clone())
        return [(tokens[i, :ki], ids[i, :ki], probs[i, :ki]) for i, ki in enumerate(ks)]


    # -- a step's advances -------------------------------------------------------------------------

    @torch.no_grad()  # not inference mode: a sequence's grown buffer stays writable eagerly
    def advance(self, seqs: Sequence[EagleSequence], features: Sequence[torch.Tensor],
                next_tokens: Sequence[list[int]]) -> None:
        """EagleSequence.advance for each sequence (serves_advance() must hold for each): its
        new columns, its length and its root as the eager advance leaves them."""
        top = self.buckets[-1]
        for at in range(0, len(seqs), top):
            self._advance_group(seqs[at:at + top], features[at:at + top],
                                next_tokens[at:at + top])

    def _advance_group(self, seqs, features, next_tokens) -> None:
        n = len(seqs)
        b = self.bucket(n)
        sizes = [len(t) for t in next_tokens]
        width = self.width(max(sizes))
        starts = [s.length for s in seqs]
        for i, (s, n_cached) in enumerate(zip(seqs, starts)):
            s._reserve(n_cached + sizes[i])
            self.keys[i, :, :n_cached].copy_(s.keys[0, :, :n_cached])
            self.values[i, :, :n_cached].copy_(s.values[0, :, :n_cached])
        # every sequence's rows into its row of the padded inputs: one indexed copy for all
        w = self.widths[-1]
        rows = [i * w + r for i, size in enumerate(sizes) for r in range(size)]
        where = dev.to_device(torch.tensor(rows), self.device)
        self.feats.view(-1, self.feats.shape[-1]).index_copy_(
            0, where, torch.cat(list(features)).to(self.feats.dtype))
        ids = dev.to_device(torch.tensor([t for toks in next_tokens for t in toks]), self.device)
        self.next_ids.view(-1).index_copy_(0, where, ids)
        pad = [0] * (b - n)
        self.start[:b].copy_(dev.to_device(torch.tensor(starts + pad), self.device))
        self.last[:b].copy_(dev.to_device(torch.tensor([r - 1 for r in sizes] + pad),
                                          self.device))
        graph = self.advance_graphs.get((b, width))
        if graph is not None:
            graph.replay()
        else:
            self.advance_rows(b, width)
        roots, logits = self.hidden[:n].clone(), self.logits[:n].clone()
        for i, (s, n_cached, size) in enumerate(zip(seqs, starts, sizes)):
            end = n_cached + size
            s.keys[:, :, n_cached:end].copy_(self.keys[i:i + 1, :, n_cached:end])
            s.values[:, :, n_cached:end].copy_(self.values[i:i + 1, :, n_cached:end])
            s.length = end
            s.root_out, s.root_logits = roots[i], logits[i]
            s.root_token = ids[sum(sizes[:i + 1]) - 1]


def sampled_pick(head: EagleHead, logits: torch.Tensor, sampling: dict[str, torch.Tensor],
                 halves: torch.Tensor, noise: torch.Tensor, top_k: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's token drawn from its truncated q, all on the device at fixed shapes (what a
    captured pick records): its parameters (`sampling`, [n] each; keyed > 0 when seeded) over
    logits [n, Vd], the top_k truncated q, and the exponential race over it with the noise keyed
    at the target ids (halves [n, 2]) or the drawn Exp(1) noise [n, K]. -> (target ids [n], q
    ids [n, K], q probabilities [n, K])"""
    q = apply_sampling_params(logits.float(), sampling["temperature"], sampling["top_k"],
                              sampling["top_p"], sampling["min_p"], static=True)  # [n, Vd]
    vals, idx = truncate(q, top_k)  # [n, K]
    ids = head.target_ids(idx)  # [n, K]: the noise is keyed at target ids
    noise = torch.where(sampling["keyed"][:, None] > 0, keyed_exponentials_at(halves, ids),
                        noise)
    return race(vals, ids, noise), ids, vals


def causal_columns_rows(columns: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """What each sequence's rows fed at columns pos [b, W] see: each, every column up to its
    own. [b, 1, W, C]"""
    return (columns[None, None, :] <= pos[:, :, None])[:, None]


def visible_columns_rows(columns: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """What each row's token fed at its column col [b] sees: every column up to its own.
    [b, 1, 1, C]"""
    return (columns[None, :] <= col[:, None])[:, None, None, :]
