"""The EAGLE head's drafting (greedy and sampled chains, EAGLE-2 trees) and its advance,
replayed as device graphs over static buffers.

On an accelerator one row of the head is some forty eager launches (embedding, two norms, the
fused products, RoPE, attention, the MLP, the logits, the argmax): measured on an H100, 1.2-1.5
ms a drafted token beside a 1.3 ms captured target step, and as much again for the advance over
each step's kept rows. Here each is one replay. The buffers, for one sequence at a time:

    keys, values  [1, kv_heads, capacity, head_dim]: the sequence's rows with target features
                  (copied in, device to device, before the replays) and the rows being written
    hidden, logits  the predictor of the next token: the root's output and logits, then each
                  fed token's
    col, j        the column the next fed token is written at (its position), the output index
    tokens        [max_k]: the drafted target ids
    feats, next_ids, start, last   an advance's input: up to `widths[-1]` rows of the target's
                  features and the tokens after them (padded), the first row's column, the
                  index of the last real row

The chain iteration (one graph) takes the argmax of `logits` as token j, feeds it at column
`col` with `hidden` (keys and values written there, attention over the capacity masked to the
columns up to `col`), leaves the output and its logits in `hidden` and `logits`, and moves
`col` and `j` on. A chain of k is one copy in, k - 1 replays, one argmax, one copy out: the
tokens `EagleSequence.chain` drafts. The sequence's own buffer is not written: its scratch rows
are overwritten by the next advance anyway.

A sampled chain replays a second iteration graph that picks token j as `sampled_chain` does:
the request's temperature, top-k, top-p and min-p over the logits, the top-K truncated q, and
the exponential race over it with the keyed noise of the token's position (seeded requests,
computed at the target ids inside the graph) or Exp(1) noise drawn on the device before the
first replay (unseeded); each token's q row (target ids, probabilities) is written beside it.
The parameters and keys are copied in once per chain; tokens and q rows come back in one copy.

An EAGLE-2 tree replays one graph per (children per node, depth) captured at start-up: the
whole of `EagleSequence.tree` over the static buffers (the frontier's rows written from column
col on, each seeing the committed columns and its own ancestors among the fed rows through a
mask over the capacity), then every candidate listed best first. A tree of node budget n is
the first n of that list (a prefix of the best-first order holds every member's parent), read
back once with its parents.

The advance (one graph per width bucket) feeds the kept rows at columns start .. start + W - 1
(each row sees the columns up to its own; padding rows write columns past the real ones, which
nothing reads), and leaves the last real row's output and logits in `hidden` and `logits`; the
new columns and that root are copied out into the sequence (`EagleSequence.advance`'s effect).

A step's chains (greedy or sampled) and advances over two or more sequences replay one
batched iteration per level, and one batched advance, for all of them instead
(verifier_service/methods/eagle/batch_graphs.py, `batch`).

On the CPU they all run eagerly over the same buffers (what the tests compare with the head's own
loops); the verifier uses them only where they are captured. Prefill chunks wider than the
widest bucket keep the eager code. The graphs read the head's RoPE table:
it is grown to the capacity before capture and kept here, so a later growth by eager code
cannot free what the graphs read.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import torch

from kernels.eagle_tree import TreeState, first_level, next_level, num_candidates, select
from kernels.sampling import key_halves, noise_key
from splitspec import device as dev
from splitspec.graphs import powers_up_to
from splitspec.params import SamplingParams
from splitspec.proposal import Draft
from verifier_service.methods.eagle.batch_graphs import EagleBatch, sampled_pick
from verifier_service.methods.eagle.head import EagleHead, EagleSequence, sampled_draft
from verifier_service.methods.in_target import PendingDraft

log = logging.getLogger(__name__)


class EagleGraphs:
    def __init__(self, head: EagleHead, capacity: int, max_k: int, capture: bool = True,
                 top_k: int = 16, tree_shapes: Sequence[tuple[int, int]] = (),
                 max_batch: int = 1):
        """capacity: columns (positions) a sequence may reach and draft from here (longer
        ones draft eagerly); max_k: drafted tokens per chain at most (an advance keeps up to
        1 + max_k rows: the widths are powers of two up to that); top_k: K of a sampled
        chain's truncated q; tree_shapes: the (children per node, depth) of the trees
        captured; max_batch: chains and advances of up to this many sequences replay
        together (verifier_service/methods/eagle/batch_graphs.py; 1: none)."""
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
        # a sampled chain: the request's parameters [1] each (keyed: 1 when seeded), its noise
        # keys per token [max_k, 2], unseeded noise [max_k, K]; out: each token's q row
        self.top_k = min(top_k, width)
        self.sampling = {name: torch.zeros(1, dtype=dtype, device=device) for name, dtype in (
            ("temperature", torch.float32), ("top_k", torch.long), ("top_p", torch.float32),
            ("min_p", torch.float32), ("keyed", torch.long))}
        self.halves = torch.zeros(max_k, 2, dtype=torch.long, device=device)
        self.noise = torch.ones(max_k, self.top_k, dtype=torch.float32, device=device)
        self.q_ids = torch.zeros(max_k, self.top_k, dtype=torch.long, device=device)
        self.q_probs = torch.zeros(max_k, self.top_k, dtype=torch.float32, device=device)
        self.columns = torch.arange(capacity, device=device)
        self.widths = powers_up_to(1 + max_k)
        w = self.widths[-1]
        self.feats = torch.zeros(w, s.feature_size, dtype=head.dtype, device=device)
        self.next_ids = torch.zeros(w, dtype=torch.long, device=device)
        self.start = torch.zeros(1, dtype=torch.long, device=device)
        self.last = torch.zeros(1, dtype=torch.long, device=device)
        self.graph = None
        self.sampled_graph = None
        self.pick_graphs: dict[bool, object] = {}  # a chain's last pick, greedy and sampled
        self.tree_shapes = tuple(tree_shapes)
        self.tree_graphs: dict[tuple[int, int], tuple[object, tuple]] = {}
        self.advance_graphs: dict[int, object] = {}
        # a step's greedy chains and advances over several sequences, one replay for all of them
        self.batch = (EagleBatch(head, capacity, max_k, max_batch, top_k) if max_batch > 1
                      else None)
        self._pool = None
        # device memory the captured graphs and the batched chains' buffers hold (CUDA), beside
        # the target's
        self.pool_bytes = 0
        self._rope = None  # the RoPE table the graph reads (kept alive here)
        self.fetch = dev.HostFetch(device)

    @property
    def captured(self) -> bool:
        """Whether greedy chains replay a graph here."""
        return self.graph is not None

    @property
    def captured_sampled(self) -> bool:
        """Whether sampled chains replay a graph here."""
        return self.sampled_graph is not None

    def captured_tree(self, top_k: int, depth: int) -> bool:
        """Whether a tree of top_k children per node and `depth` levels replays a graph."""
        return (top_k, depth) in self.tree_graphs

    def serves_tree(self, seq: EagleSequence, top_k: int, depth: int) -> bool:
        """Whether such a tree from this sequence's root runs here: every column its fed
        levels write (length .. length + (depth - 1) * top_k - 1) fits the capacity."""
        return seq.root_out is not None and depth >= 1 and \
            seq.length + (depth - 1) * top_k <= self.capacity

    def captured_advance(self, rows: int) -> bool:
        """Whether an advance by `rows` rows replays a graph here."""
        return rows <= self.widths[-1] and self.width(rows) in self.advance_graphs

    def serves(self, seq: EagleSequence, k: int) -> bool:
        """Whether a chain of k from this sequence's root runs here: every column it
        writes (length .. length + k - 2) fits the capacity."""
        return 0 < k <= self.max_k and seq.root_out is not None and \
            seq.length + k - 1 <= self.capacity

    def serves_advance(self, seq: EagleSequence, rows: int) -> bool:
        """Whether an advance by `rows` rows runs here: a width holds them and every column its
        bucket writes fits the capacity."""
        return 0 < rows <= self.widths[-1] and \
            seq.length + self.width(rows) <= self.capacity

    def width(self, rows: int) -> int:
        return next(w for w in self.widths if w >= rows)

    # -- one iteration (what the graph records) --------------------------------------------------

    def pick(self, sampled: bool = False) -> torch.Tensor:
        """Token j from logits into tokens[j] (and, sampled, its q row into q_ids, q_probs):
        argmax, or drawn from the truncated q by the request's parameters. [1] target id."""
        head = self.head
        if not sampled:
            tok = head.target_ids(self.logits.argmax(-1, keepdim=True))  # [1]: a gather
        else:
            tok, ids, vals = sampled_pick(head, self.logits[None], self.sampling,
                                          self.halves.index_select(0, self.j),
                                          self.noise.index_select(0, self.j), self.top_k)
            self.q_ids.index_copy_(0, self.j, ids)
            self.q_probs.index_copy_(0, self.j, vals)
        self.tokens.index_copy_(0, self.j, tok)
        return tok

    def iteration(self, sampled: bool = False) -> None:
        """Token j picked from logits, fed at column col; hidden, logits, col and j move on."""
        head = self.head
        tok = self.pick(sampled)
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

    def tree_body(self, top_k: int, depth: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """EagleSequence.tree from the root in hidden and logits, its fed rows written from
        column col on: every candidate best first, as (target ids, parents as indices into
        that list, cumulative log-probabilities) [num_candidates]."""
        head, k = self.head, top_k
        state = TreeState(k, depth, self.device)
        toks = head.target_ids(first_level(state, self.logits.float().log_softmax(-1)))
        hidden = self.hidden.expand(k, -1)  # [k, H]: each frontier node's predictor
        for level in range(2, depth + 1):
            # level - 1's frontier: k rows at one position after the root
            cols = self.col + (level - 2) * k + self.columns[:k]  # [k]
            pos = (self.col + level - 2).expand(1, k)  # [1, k]
            mask = tree_columns(self.columns, self.col, state.ancestors, level, k)

            def attend(q, kk, vv, cols=cols, mask=mask):
                self.keys.index_copy_(2, cols, kk)
                self.values.index_copy_(2, cols, vv)
                return head.attention(q, self.keys, self.values, mask)

            out = head.layer(toks[None], hidden[None], pos, attend, self.capacity)[0]  # [k, H]
            logp = head.logits(out).float().log_softmax(-1)  # [k, Vd]
            draft_toks, rows = next_level(state, level, logp)
            toks = head.target_ids(draft_toks)
            hidden = out[rows]
        kept, parents = select(state.scores, state.parents, num_candidates(k, depth))
        return head.target_ids(state.tokens[kept]), parents, state.scores[kept]

    def advance_rows(self, width: int) -> None:
        """The target's rows feats[:width] at columns start .. start + width - 1; the output
        and logits of row `last` into hidden and logits."""
        head = self.head
        pos = self.start + self.columns[:width]  # [W]
        mask = causal_columns(self.columns, pos)

        def attend(q, k, v):
            self.keys.index_copy_(2, pos, k)
            self.values.index_copy_(2, pos, v)
            return head.attention(q, self.keys, self.values, mask)

        hidden = head.hidden_from_features(self.feats[:width])[None]  # [1, W, H]
        out = head.layer(self.next_ids[:width][None], hidden, pos[None], attend,
                         self.capacity)[0]
        root = out.index_select(0, self.last)[0]
        self.hidden.copy_(root)
        self.logits.copy_(head.logits(root))

    def _run(self, sampled: bool = False) -> None:
        graph = self.sampled_graph if sampled else self.graph
        if graph is not None:
            graph.replay()
        else:
            self.iteration(sampled)

    def _last_pick(self, sampled: bool = False) -> None:
        """A chain's last token (its k - 1 iterations fed the others): a replayed graph where
        one was captured (a sampled pick is some thirty launches), else eagerly."""
        graph = self.pick_graphs.get(sampled)
        if graph is not None:
            graph.replay()
        else:
            self.pick(sampled)

    def _run_advance(self, width: int) -> None:
        graph = self.advance_graphs.get(width)
        if graph is not None:
            graph.replay()
        else:
            self.advance_rows(width)

    # -- capture ---------------------------------------------------------------------------------

    def capture(self) -> None:
        """The chain iteration and the advance at every width, one graph each, in one pool
        (start-up); a shape whose capture fails runs eagerly, logged."""
        if not self.capture_wanted:
            return
        start, device, head = time.perf_counter(), self.device, self.head
        before = torch.cuda.memory_reserved(device) if device.type == "cuda" else 0
        head.rope(self.columns[:1], self.capacity)  # the table covers every column first
        self._rope = head._rope_table
        self._pool = dev.graph_pool(device)
        stream = dev.new_stream(device)
        self.graph = self._capture_one(stream, self.iteration, "the chain iteration")
        self.sampled_graph = self._capture_one(stream, lambda: self.iteration(True),
                                               "the sampled chain iteration")
        for sampled in (False, True):
            graph = self._capture_one(stream, lambda s=sampled: self.pick(s),
                                      f"the {'sampled ' if sampled else ''}last pick")
            if graph is not None:
                self.pick_graphs[sampled] = graph
        for shape in self.tree_shapes:
            outputs = []
            graph = self._capture_one(stream, lambda s=shape: outputs.append(self.tree_body(*s)),
                                      f"the tree of {shape[0]} children x {shape[1]} levels")
            if graph is not None:
                self.tree_graphs[shape] = (graph, outputs[-1])
        for width in reversed(self.widths):
            graph = self._capture_one(stream, lambda w=width: self.advance_rows(w),
                                      f"the advance over {width} rows")
            if graph is not None:
                self.advance_graphs[width] = graph
        if self.batch is not None:
            self.batch.capture(lambda body, what: self._capture_one(stream, body, what))
        dev.synchronize(device)
        if device.type == "cuda":
            self.pool_bytes = (torch.cuda.memory_reserved(device) - before
                               + (self.batch.bytes if self.batch is not None else 0))
        log.info("captured the EAGLE chain iteration (greedy %s, sampled %s), %d of %d tree "
                 "shapes, %d advance widths of %s and %d greedy / %d sampled batched chain "
                 "buckets of %s (capacity %d, k up to %d) in %.2f s, %.1f MiB of device memory",
                 "yes" if self.graph is not None else "no",
                 "yes" if self.sampled_graph is not None else "no", len(self.tree_graphs),
                 len(self.tree_shapes), len(self.advance_graphs), list(self.widths),
                 len(self.batch.graphs) if self.batch is not None else 0,
                 len(self.batch.sampled_graphs) if self.batch is not None else 0,
                 self.batch.buckets if self.batch is not None else [], self.capacity,
                 self.max_k, time.perf_counter() - start, self.pool_bytes / 2**20)

    def _capture_one(self, stream, body, what: str):
        device = self.device
        try:
            stream.wait_stream(dev.current_stream(device))
            with torch.inference_mode(), dev.use_stream(device, stream):
                for _ in range(2):
                    self._reset()
                    body()
            dev.current_stream(device).wait_stream(stream)
            self._reset()
            graph = dev.new_graph(device)
            with torch.inference_mode(), dev.capture(device, graph, self._pool, stream):
                body()
            return graph
        except Exception:  # noqa: BLE001 - that shape runs eagerly, logged
            log.exception("capturing %s of the EAGLE head failed; it runs eagerly", what)
            return None

    def _reset(self) -> None:
        for t in (self.col, self.j, self.start, self.last):
            t.zero_()
        if self.batch is not None:
            self.batch.reset()

    # -- a chain ---------------------------------------------------------------------------------

    def resolve(self, pending: PendingDraft) -> "list[int] | Draft":
        """A pending draft's candidates on the host now (one copy, one wait)."""
        return pending.finish(*self.fetch(pending.ints, pending.floats))

    def chain(self, seq: EagleSequence, k: int) -> list[int]:
        """A greedy chain of k target ids from the sequence's root (serves() must hold): the
        tokens EagleSequence.chain drafts, one host read."""
        return self.resolve(self.pending_chain(seq, k))

    @torch.no_grad()  # not inference mode: tensors it makes stay writable by the eager code
    def pending_chain(self, seq: EagleSequence, k: int) -> PendingDraft:
        """chain() left on the device: its tokens copied out of the static buffers (the next
        sequence's chain reuses them), read back with the rest of the step's."""
        self._start_chain(seq)
        for _ in range(k - 1):
            self._run()
        self._last_pick()
        tokens = self.tokens[:k].clone()
        return PendingDraft([tokens], [], lambda i, f: i[0].tolist(), ids=tokens)

    def sampled_chain(self, seq: EagleSequence, k: int, params: SamplingParams,
                      first_position: int) -> Draft:
        """A chain of k drawn from the head's q after the request's parameters (serves() must
        hold): what EagleSequence.sampled_chain drafts with this K (a seeded request: the very
        tokens; unseeded: draws from the same q), each token with the q it was drawn from; one
        copy in of the parameters, one host read."""
        return self.resolve(self.pending_sampled_chain(seq, k, params, first_position))

    @torch.no_grad()
    def pending_sampled_chain(self, seq: EagleSequence, k: int, params: SamplingParams,
                              first_position: int) -> PendingDraft:
        """sampled_chain() left on the device (as pending_chain)."""
        s, p = self.sampling, params
        for name, value in (("temperature", p.temperature), ("top_k", p.top_k),
                            ("top_p", p.top_p), ("min_p", p.min_p),
                            ("keyed", int(p.seed is not None))):
            s[name].fill_(value)
        if p.seed is not None:
            keys = [noise_key(p.seed, first_position + i) for i in range(k)]
            self.halves[:k].copy_(dev.to_device(key_halves(keys), self.device))
        else:
            self.noise[:k].uniform_().log_().neg_()  # Exp(1), as draw_exponentials
        self._start_chain(seq)
        for _ in range(k - 1):
            self._run(sampled=True)
        self._last_pick(sampled=True)
        tokens, q_ids, q_probs = (self.tokens[:k].clone(), self.q_ids[:k].clone(),
                                  self.q_probs[:k].clone())
        return PendingDraft([tokens, q_ids], [q_probs],
                            lambda i, f: sampled_draft(i[0], i[1], f[0]), ids=tokens,
                            q_ids=q_ids, q_probs=q_probs)

    def tree(self, seq: EagleSequence, top_k: int, depth: int, budget: int) -> Draft:
        """EagleSequence.draft_tree over the static buffers (serves_tree() must hold): the same
        nodes and parents, one host read."""
        return self.resolve(self.pending_tree(seq, top_k, depth, budget))

    @torch.no_grad()
    def pending_tree(self, seq: EagleSequence, top_k: int, depth: int, budget: int
                     ) -> PendingDraft:
        """tree() left on the device (as pending_chain)."""
        self._start_chain(seq)
        found = self.tree_graphs.get((top_k, depth))
        if found is not None:
            graph, (tokens, parents, _) = found
            graph.replay()
        else:
            tokens, parents, _ = self.tree_body(top_k, depth)
        n = min(budget, num_candidates(top_k, depth))
        ids, tree = tokens[:n].clone(), parents[:n].clone()
        return PendingDraft([ids, tree], [],
                            lambda i, f: Draft("", i[0].tolist(), parents=i[1].tolist()),
                            ids=ids, parents=tree, max_depth=depth, max_children=top_k)

    def _start_chain(self, seq: EagleSequence) -> None:
        """The sequence's columns and root into the buffers; the chain's first column and
        token index."""
        n = seq.length
        self.keys[:, :, :n].copy_(seq.keys[:, :, :n])
        self.values[:, :, :n].copy_(seq.values[:, :, :n])
        self.hidden.copy_(seq.root_out)
        self.logits.copy_(seq.root_logits)
        self.col.fill_(n)
        self.j.zero_()


    @torch.no_grad()  # not inference mode: a sequence's grown buffer stays writable eagerly
    def advance(self, seq: EagleSequence, features: torch.Tensor,
                next_tokens: torch.Tensor) -> None:
        """EagleSequence.advance over the static buffers (serves_advance() must hold): the
        sequence's new columns, its length and its root as the eager advance leaves them."""
        rows, n = features.shape[0], seq.length
        width = self.width(rows)
        seq._reserve(n + rows)
        self.keys[:, :, :n].copy_(seq.keys[:, :, :n])
        self.values[:, :, :n].copy_(seq.values[:, :, :n])
        self.feats[:rows].copy_(features)
        self.next_ids[:rows].copy_(next_tokens)
        self.start.fill_(n)
        self.last.fill_(rows - 1)
        self._run_advance(width)
        seq.keys[:, :, n:n + rows].copy_(self.keys[:, :, n:n + rows])
        seq.values[:, :, n:n + rows].copy_(self.values[:, :, n:n + rows])
        seq.length = n + rows
        seq.root_out = self.hidden.clone()
        seq.root_logits = self.logits.clone()
        seq.root_token = self.next_ids[rows - 1].clone()


def causal_columns(columns: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """What rows fed at columns `pos` [W] see: each, every column up to its own.
    [1, 1, W, C]"""
    return (columns[None, :] <= pos[:, None])[None, None]


def tree_columns(columns: torch.Tensor, base: torch.Tensor, ancestors: torch.Tensor,
                 level: int, k: int) -> torch.Tensor:
    """What level - 1's frontier rows see when fed, over every column [1, 1, k, C]: the
    committed columns (before base [1]) and, among the fed rows (columns base on, k per
    level), each row's own ancestors and itself (ancestors [k, depth * k], kernels/
    eagle_tree.py)."""
    rel = columns - base  # [C]
    fed = (rel >= 0) & (rel < (level - 1) * k)
    anc = ancestors[:, rel.clamp(0, ancestors.shape[1] - 1)]  # [k, C]
    return ((rel < 0)[None] | (fed[None] & anc))[None, None]


def visible_columns(columns: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """What the row fed at column `col` [1] sees: every column up to its own. [1, 1, 1, C]"""
    return (columns <= col)[None, None, None]
