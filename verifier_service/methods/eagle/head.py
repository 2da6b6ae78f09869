"""An EAGLE head on the target's features, as plain tensor code: the one-layer decoder, its
per-sequence KV cache, and drafting chains and EAGLE-2 trees from it.

The head predicts the token after next from the target's features at a position and the token
that position produced. Row j of the head (position j) takes

    EAGLE-1/2  x = fc(cat(embed(x_{j+1}), f_j)) (+ fc.bias)   f_j: the target's final-norm hidden
               one Llama decoder layer over x (no input norm)  state at position j
               out_j = its output; logits = target_lm_head(out_j)
    EAGLE-3    h = fc(cat(a_j, b_j, c_j))                      a, b, c: the residual stream
               x = cat(input_norm(embed(x_{j+1})), hidden_norm(h)),   entering the three feature
               attention over x (2H wide), residual h (or hidden_norm(h) with norm_before_residual),
               post-attention norm and MLP; out_j = the layer's output (before `norm`);
               logits = lm_head(norm(out_j)) over the draft vocabulary, target id = id + d2t[id]

and predicts x_{j+2}. Drafting further feeds the head its own out_j in place of the target's
features (EAGLE-3's h = out_j, no fc; EAGLE-1's f = out_j through fc again), with the drafted
token, one position on.

Per sequence (`EagleSequence`) the head keeps its decoder layer's keys and values in one
preallocated buffer [1, kv_heads, capacity, head_dim]: column j holds row j, for every row whose
target features are known (`length` of them: every position of the sequence but the last, whose
token has not been fed to the target yet). A step's drafting writes scratch rows past `length`
(which the next `advance` overwrites); `advance(features, next_tokens)` writes the target's rows
for the positions the step kept (the root and the accepted nodes), replacing the head's own
guesses there, and makes the last of them the root of the next draft.

Products: q|k|v and gate|up run as one fused product each; a head built for drafting
(`linear="auto"`) packs every product once for the device's skinniest matmul (kernels/linear.py:
on a CPU fp16-exact weights read as fp16, half the bytes of a step that streams every weight for
one or a few rows; drafts need no batch-invariant numbers). RoPE's cos/sin come from a table
grown by doubling. The default, dense, keeps autograd for training.

Host syncs: none inside the per-token loops of `chain`, `tree` and `sampled_chain` (argmax,
top-k, draws and gathers stay on the device). A chain or tree becomes host lists once, when it is
turned into a Draft; a sampled chain reads its tokens and their q rows back in one copy at the
end. The verifier's EAGLE method takes the device tensors instead (`chain_many`, `tree`,
`sampled_chain_rows`) and hands them to the step unread (methods/in_target.py DeviceDraft).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels.eagle_tree import TreeState, first_level, next_level, select
from kernels.linear import PackedLinear, resolve
from kernels.sampling import (
    apply_sampling_params,
    draw_exponentials,
    keyed_exponentials,
    noise_key,
    truncate,
)
from kernels.sparse_probs import SparseProbs
from splitspec.device import HostFetch, to_device
from splitspec.params import SamplingParams
from splitspec.proposal import Draft
from verifier_service.methods.eagle import checkpoint as eagle_format
from verifier_service.methods.eagle.checkpoint import EagleSpec, EagleWeights

# The weights that only the products read: a packed head keeps them in `proj` alone.
_PRODUCT_FIELDS = ("q", "k", "v", "o", "gate", "up", "down", "fc", "lm_head")
_RELEASED = torch.empty(0)  # stands for a weight a packed head let go


def eagle1_input(embedding: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """What an EAGLE-1/2 head's fc reads: the token's embedding, then the hidden state."""
    return torch.cat([embedding, hidden], -1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: computed in float32, scaled by weight in x's dtype."""
    if x.dtype == torch.float32 and not (x.requires_grad or weight.requires_grad):
        return F.rms_norm(x, weight.shape, weight, eps)  # one fused op
    dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def _fused_bias(weights: list[torch.Tensor], biases: list[torch.Tensor | None]
                ) -> torch.Tensor | None:
    """The biases of products fused side by side (zeros where one has none), None if none has."""
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else w.new_zeros(w.shape[0])
                      for w, b in zip(weights, biases)])


def _product(weight: torch.Tensor, bias: torch.Tensor | None, backend: str):
    """x -> x @ weight.T + bias: F.linear for dense (autograd flows to the weights), else the
    weight packed once (kernels/linear.py; a drafter's rows need not be batch invariant)."""
    if backend == "dense":
        return functools.partial(F.linear, weight=weight, bias=bias)
    return PackedLinear(weight, bias, backend, invariant=False)


class EagleHead:
    """A head bound to its target: its weights on the target's device and dtype, the target's
    token embedding (unless the head has its own) and, for EAGLE-1/2, the target's output head
    (optionally only the rows `vocab_ids`, a frequency-ranked subset)."""

    def __init__(self, spec: EagleSpec, weights: EagleWeights, target_embed: torch.Tensor,
                 target_head: torch.Tensor | None = None, vocab_ids: torch.Tensor | None = None,
                 dtype: torch.dtype | None = None, linear: str = "dense"):
        """linear: the products' matmul backend (kernels/linear.py): dense (training: autograd
        reaches the weights) or, for drafting, auto / onednn / fp16, packed once."""
        self.spec = spec
        dtype = dtype or target_embed.dtype
        device = target_embed.device
        self.dtype, self.device = dtype, device

        def put(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device=device, dtype=dtype)

        w = weights
        self.w = EagleWeights(**{name: (t.to(device) if name in ("d2t", "t2d") else put(t))
                                 for name, t in w.tensors().items()})
        reads = eagle_format.target_tables(spec, weights)
        self.embed = put(target_embed) if "embed" in reads else self.w.embed
        if "head" not in reads:
            self.head = self.w.lm_head
            self.ids = self.w.draft_to_target()  # [Vd] target id of each draft id, or None
        else:
            if target_head is None:
                raise ValueError("this head scores with the target's output head: pass it")
            head = put(target_head)
            self.head = head if vocab_ids is None else head[vocab_ids.to(device)]
            self.ids = None if vocab_ids is None else vocab_ids.to(device)
        if self.ids is not None and bool((self.ids == torch.arange(
                len(self.ids), device=device)).all()) and len(self.ids) == spec.vocab_size:
            self.ids = None  # the identity
        self.scale = spec.head_dim ** -0.5
        self.fetch = HostFetch(device)  # a draft's one read back (sampled chains)
        self.inv_freq = eagle_format.rope_inv_freq(spec).to(device)
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin [N, D]
        # the products: q|k|v and gate|up fused, each packed once for `linear`
        s, w = spec, self.w
        qkv = [w.q, w.k, w.v]
        mats = {"qkv": (torch.cat(qkv), _fused_bias(qkv, [w.q_bias, w.k_bias, w.v_bias])),
                "o": (w.o, w.o_bias), "gate_up": (torch.cat([w.gate, w.up]), None),
                "down": (w.down, None), "logits": (self.head, None)}
        if w.fc is not None:
            mats["fc"] = (w.fc, w.fc_bias)
        self.linear = linear if linear == "dense" else resolve(
            linear, [m for m, _ in mats.values()], invariant=False)
        self.proj = {name: _product(m, b, self.linear) for name, (m, b) in mats.items()}
        if self.linear != "dense":  # the packed copies are what runs: let the loaded ones go
            # (the norms and maps stay in self.w): the fp32 weights of every product, 55 MiB
            # for the real model's head (a target's head it scores with stays the target's)
            self.w = dataclasses.replace(self.w, **{f: _RELEASED for f in _PRODUCT_FIELDS
                                                    if getattr(self.w, f) is not None})
            self.head = _RELEASED
            for product in self.proj.values():
                product.release_weight()
        self.split_qkv = (s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim,
                          s.num_kv_heads * s.head_dim)

    @classmethod
    def from_dir(cls, path: str | Path, target_embed: torch.Tensor,
                 target_head: torch.Tensor | None = None, **kw) -> "EagleHead":
        spec, weights = eagle_format.load(path)
        return cls(spec, weights, target_embed, target_head, **kw)

    # -- the math (plain tensor ops; autograd works through them for training) -------------

    def hidden_from_features(self, feats: torch.Tensor) -> torch.Tensor:
        """The target's features [..., feature_size] as the layer's hidden input [..., H]:
        EAGLE-3 fuses the three layers' inputs with fc; EAGLE-1/2 take the final state as is
        (their fc acts on every row, in `layer`)."""
        if self.spec.version == 3 and self.spec.use_aux_hidden_state:
            return self.proj["fc"](feats.to(self.dtype))
        return feats.to(self.dtype)

    def rope(self, pos: torch.Tensor, upto: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [..., R, 1, head_dim] at positions pos [..., R] (the spec's scaling is in
        inv_freq). upto: a bound the caller knows on the host (every position < upto): the
        values are gathered from a table, the same numbers as computed from pos."""
        if upto is None:
            freqs = pos.to(torch.float32)[..., None] * self.inv_freq
            emb = torch.cat((freqs, freqs), -1)[..., None, :]
            return emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        if self._rope_table is None or self._rope_table[0].shape[0] < upto:
            n = max(upto, 2 * (0 if self._rope_table is None else self._rope_table[0].shape[0]),
                    256)
            self._rope_table = tuple(t[:, 0] for t in self.rope(
                torch.arange(n, device=self.inv_freq.device)))
        cos, sin = self._rope_table
        return cos[pos][..., None, :], sin[pos][..., None, :]

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), -1)
        return x * cos + rot * sin

    def layer(self, tokens: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor,
              attend, upto: int | None = None) -> torch.Tensor:
        """The decoder layer over rows: tokens [B, R] (target ids), hidden [B, R, H] (fused
        target features or the head's own outputs), positions [B, R]. attend(q [B, Hq, R, D],
        k [B, Hkv, R, D], v) -> [B, R, Hq * D] is the caller's cache and mask; upto: a host
        bound on the positions (RoPE from the table, see `rope`). Returns the
        layer's output [B, R, H] (what is fed back; EAGLE-3's `norm` comes in `logits`)."""
        s, w = self.spec, self.w
        emb = F.embedding(tokens, self.embed).to(self.dtype)
        if s.version == 3:
            hn = rms_norm(hidden, w.hidden_norm, s.rms_norm_eps)
            residual = hn if s.norm_before_residual else hidden
            x = torch.cat([rms_norm(emb, w.input_norm, s.rms_norm_eps), hn], -1)
        else:
            x = self.proj["fc"](eagle1_input(emb, hidden))
            residual = x
        B, R = tokens.shape
        q, k, v = self.proj["qkv"](x).split(self.split_qkv, -1)
        q = q.reshape(B, R, s.num_heads, s.head_dim)
        k = k.reshape(B, R, s.num_kv_heads, s.head_dim)
        v = v.reshape(B, R, s.num_kv_heads, s.head_dim)
        cos, sin = self.rope(pos, upto)
        q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        att = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = residual + self.proj["o"](att)
        h = rms_norm(x, w.post_norm, s.rms_norm_eps)
        g, u = self.proj["gate_up"](h).chunk(2, -1)
        return x + self.proj["down"](F.silu(g) * u)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary [..., Vd] from layer outputs [..., H]."""
        if self.spec.version == 3:
            out = rms_norm(out, self.w.norm, self.spec.rms_norm_eps)
        return self.proj["logits"](out)

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids of draft-vocabulary ids (any shape)."""
        return draft_ids if self.ids is None else self.ids[draft_ids]

    def attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  mask: torch.Tensor | None) -> torch.Tensor:
        """SDPA over keys/values [B, Hkv, S, D] with a bool mask [B or 1, 1, R, S] (None: all)
        -> [B, R, Hq * D]."""
        groups = self.spec.num_heads // self.spec.num_kv_heads
        att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale,
                                             enable_gqa=groups > 1)
        return att.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)

    def new_sequence(self, capacity: int) -> "EagleSequence":
        return EagleSequence(self, capacity)


class EagleSequence:
    """One sequence's head state: its KV buffer and the root of its next draft."""

    def __init__(self, head: EagleHead, capacity: int):
        s = head.spec
        self.head = head
        self.length = 0  # rows whose target features the cache holds (columns 0..length-1)
        shape = (1, s.num_kv_heads, max(capacity, 1), s.head_dim)
        self.keys = torch.zeros(shape, dtype=head.dtype, device=head.device)
        self.values = torch.zeros(shape, dtype=head.dtype, device=head.device)
        self.root_out: torch.Tensor | None = None  # [H]: the last row's output
        self.root_logits: torch.Tensor | None = None  # [Vd]
        self.root_token: torch.Tensor | None = None  # [] the last row's input token

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def _reserve(self, columns: int) -> None:
        """Room for `columns` columns (doubling: a rare host-side decision, not per token)."""
        if columns <= self.capacity:
            return
        new = max(columns, 2 * self.capacity)
        grown = []
        for buf in (self.keys, self.values):
            g = buf.new_zeros(buf.shape[0], buf.shape[1], new, buf.shape[3])
            g[:, :, :self.capacity] = buf
            grown.append(g)
        self.keys, self.values = grown

    def _write(self, col: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keys/values [1, Hkv, R, D] into columns col..col+R-1 (or the columns of a tensor)."""
        if isinstance(col, int):
            self.keys[:, :, col:col + k.shape[2]] = k
            self.values[:, :, col:col + k.shape[2]] = v
        else:
            self.keys.index_copy_(2, col, k)
            self.values.index_copy_(2, col, v)

    def advance(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """The target's rows for positions length..length+R-1: features [R, feature_size] (the
        target's, from its forward, on its device), next_tokens [R] (the token at each position
        plus one: the tokens the step emitted, or the prompt shifted by one). Their keys and
        values replace whatever the columns held; the last row becomes the next draft's root."""
        advance_many([self], [features], [next_tokens])

    def truncate(self, length: int) -> None:
        """Forget rows from `length` on (a rollback); the root is gone until the next advance."""
        if length < self.length:
            self.length = length
            self.root_out = self.root_logits = self.root_token = None

    def free(self) -> None:
        self.keys = self.values = torch.zeros(0)
        self.length = 0
        self.root_out = self.root_logits = self.root_token = None

    def scratch_column(self, depth: int) -> int:
        """Where a drafted row `depth` (1-based) levels past the root is written: right after
        the rows with target features (their columns are never written by drafting)."""
        return self.length + depth - 1

    def _need_root(self) -> None:
        if self.root_out is None:
            raise RuntimeError("no root: advance the sequence with the target's features first")

    # -- chains -------------------------------------------------------------------------------

    def _step(self, token: torch.Tensor, hidden: torch.Tensor, depth: int) -> torch.Tensor:
        """Feed one drafted token (target id, [1]) with the hidden state that predicted it as
        scratch row `depth` (1-based) past the root; returns the row's output [H]."""
        return _step_many([self], token.view(1), hidden.view(1, -1), depth)[0]

    def chain(self, k: int) -> torch.Tensor:
        """A greedy chain of k drafted target ids [k] (on the device): argmax, fed back."""
        return chain_many([self], [k])[0, :k]

    def sampled_chain(self, k: int, params: SamplingParams, first_position: int,
                      top_k: int = 16) -> Draft:
        """A chain drawn from the head's own distribution after the request's sampling
        parameters (temperature, top-k, top-p, min-p), truncated to its top_k tokens: the Draft
        carries exactly the q each token was drawn from. Seeded requests draw with the keyed
        noise of the token's position (first_position + i), as the draft proposers do."""
        return sampled_chain_many([self], [k], [params], [first_position], top_k)[0]

    # -- EAGLE-2 trees ------------------------------------------------------------------------

    def tree(self, top_k: int, depth: int, budget: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """An EAGLE-2 dynamic tree: expand the top_k frontier by cumulative log-probability for
        `depth` levels, keep the `budget` best candidates. Returns (target ids [n], parents [n],
        each node's cumulative log-probability [n]) on the device, topological, siblings best
        first (n = min(budget, candidates))."""
        self._need_root()
        head = self.head
        k = top_k
        state = TreeState(k, depth, head.device)
        toks = head.target_ids(first_level(state, self.root_logits.float().log_softmax(-1)))
        hidden = self.root_out.expand(k, -1)  # [k, H]: each frontier node's predictor
        base = self.scratch_column(1)
        self._reserve(base + depth * k)
        for level in range(2, depth + 1):
            # feed level - 1's frontier: k rows at one position, each seeing the committed rows
            # and its own ancestors among the fed rows
            cols = base + (level - 2) * k + torch.arange(k, device=head.device)
            span = base + (level - 1) * k
            pos = torch.full((1, k), base + level - 2, device=head.device)
            mask = tree_mask(state, base, level)  # [1, 1, k, span]

            def attend(q, kk, vv, cols=cols, span=span, mask=mask):
                self._write(cols, kk, vv)
                return head.attention(q, self.keys[:, :, :span], self.values[:, :, :span], mask)

            out = head.layer(toks[None], hidden[None], pos, attend, span)[0]  # [k, H]
            logp = head.logits(out).float().log_softmax(-1)  # [k, Vd]
            draft_toks, rows = next_level(state, level, logp)
            toks = head.target_ids(draft_toks)
            hidden = out[rows]
        kept, parents = select(state.scores, state.parents, budget)
        return head.target_ids(state.tokens[kept]), parents, state.scores[kept]

    def draft_tree(self, top_k: int, depth: int, budget: int) -> Draft:
        """`tree` as a Draft (deterministic nodes: no q); the one host read of the tree."""
        tokens, parents, _ = self.tree(top_k, depth, budget)
        return Draft("", tokens.tolist(), parents=parents.tolist())


def advance_many(seqs: list[EagleSequence], features: list[torch.Tensor],
                 next_tokens: list[torch.Tensor]) -> None:
    """`EagleSequence.advance` for several sequences of one head in one pass of its layer: the
    products over every sequence's rows together (a step's weights read once, not once per
    sequence), the attention per sequence over its own cache, causal within its rows."""
    head = seqs[0].head
    device = head.device
    sizes = [f.shape[0] for f in features]
    starts = [s.length for s in seqs]
    for s, start, r in zip(seqs, starts, sizes):
        s._reserve(start + r)
    hidden = head.hidden_from_features(_cat(features))[None]  # [1, T, H]
    tokens = _cat([t.to(device=device, dtype=torch.long) for t in next_tokens])[None]
    pos = _cat([torch.arange(a, a + r, device=device) for a, r in zip(starts, sizes)])[None]
    ends = [a + r for a, r in zip(starts, sizes)]

    def attend(q, k, v):
        parts, at = [], 0
        for s, start, r, span in zip(seqs, starts, sizes, ends):
            s._write(start, k[:, :, at:at + r], v[:, :, at:at + r])
            causal = (torch.arange(span, device=device)[None, :]
                      <= torch.arange(start, span, device=device)[:, None])[None, None]
            parts.append(head.attention(q[:, :, at:at + r], s.keys[:, :, :span],
                                        s.values[:, :, :span], causal))
            at += r
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    out = head.layer(tokens, hidden, pos, attend, max(ends))[0]  # [T, H]
    last = [sum(sizes[:i + 1]) - 1 for i in range(len(seqs))]
    roots = (out[last[0]:last[0] + 1] if len(seqs) == 1
             else out.index_select(0, to_device(torch.tensor(last), device)))  # [n, H]
    logits = head.logits(roots)  # [n, Vd]
    for i, (s, span) in enumerate(zip(seqs, ends)):
        s.length = span
        s.root_out, s.root_logits = roots[i], logits[i]
        s.root_token = tokens[0, last[i]]


def chain_many(seqs: list[EagleSequence], ks: list[int]) -> torch.Tensor:
    """`EagleSequence.chain` for several sequences of one head: greedy chains of ks[i] tokens,
    [n, max(ks)] target ids on the device (row i's first ks[i] are its chain). Each drafted
    level is one pass of the layer over every sequence still drafting (the products read their
    weights once for all of them), the attention per sequence over its own cache. Rows are
    taken longest chain first so that those still drafting are a prefix: no index built on the
    host, no read back."""
    for s in seqs:
        s._need_root()
    head = seqs[0].head
    order = sorted(range(len(seqs)), key=lambda i: -ks[i])
    ranked = [seqs[i] for i in order]
    kmax = max(ks)
    logits = _stack([s.root_logits for s in ranked])  # [n, Vd]
    hidden = _stack([s.root_out for s in ranked])  # [n, H]
    columns = []
    for depth in range(1, kmax + 1):
        tok = head.target_ids(logits.argmax(-1))  # [m]
        short = len(seqs) - tok.shape[0]
        columns.append(F.pad(tok, (0, short)) if short else tok)
        m = sum(1 for i in order if ks[i] > depth)  # rows that draft another token
        if not m:
            break
        hidden = _step_many(ranked[:m], tok[:m], hidden[:m], depth)
        logits = head.logits(hidden)
    return unrank(torch.stack(columns, 1), order)  # [n, kmax]


@torch.no_grad()
def sampled_chain_rows(seqs: list[EagleSequence], ks: list[int], params: list[SamplingParams],
                       first_positions: list[int], top_k: int = 16
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`EagleSequence.sampled_chain` for several sequences of one head: each level is one pass
    of the layer over the sequences still drafting, the sampling parameters applied row by row
    (each sequence its own), each row's token drawn from its own truncated q with its own noise
    (keyed by (seed, first_positions[i] + level) for a seeded request, so that a seeded chain
    does not depend on the batch it was drafted in). Returns, on the device, the tokens
    [n, max(ks)], and each token's truncated q: target ids and probabilities [n, max(ks), K]
    (row i's first ks[i] are its chain)."""
    for s in seqs:
        s._need_root()
    head = seqs[0].head
    device = head.device
    n, kmax = len(seqs), max(ks)
    order = sorted(range(n), key=lambda i: -ks[i])  # those still drafting are a prefix
    ranked = [seqs[i] for i in order]
    ranked_params = [params[i] for i in order]
    settings = sampling_settings(ranked_params)
    logits = _stack([s.root_logits for s in ranked])  # [n, Vd]
    hidden = _stack([s.root_out for s in ranked])  # [n, H]
    toks, id_cols, val_cols = [], [], []
    for level in range(kmax):
        m = logits.shape[0]  # rows drafting this level
        q = apply_sampling_params(logits.float(), *(t[:m] for t in settings))  # [m, Vd]
        vals, idx = truncate(q, min(top_k, q.shape[-1]))  # [m, K]
        ids = head.target_ids(idx)  # [m, K]
        noise = draw_exponentials(m, ids.shape[1], device)
        keyed = [r for r in range(m) if ranked_params[r].seed is not None]
        if keyed:
            keys = [noise_key(ranked_params[r].seed, first_positions[order[r]] + level)
                    for r in keyed]
            rows = to_device(torch.tensor(keyed), device)
            noise[rows] = keyed_exponentials(keys, ids.index_select(0, rows))
        tok = ids.gather(1, (vals / noise).argmax(-1, keepdim=True))[:, 0]  # [m]: no read
        short = n - m
        toks.append(F.pad(tok, (0, short)) if short else tok)
        id_cols.append(F.pad(ids, (0, 0, 0, short)) if short else ids)
        val_cols.append(F.pad(vals, (0, 0, 0, short)) if short else vals)
        more = sum(1 for i in order if ks[i] > level + 1)  # rows that draft another token
        if not more:
            break
        hidden = _step_many(ranked[:more], tok[:more], hidden[:more], level + 1)
        logits = head.logits(hidden)
    return (unrank(torch.stack(toks, 1), order), unrank(torch.stack(id_cols, 1), order),
            unrank(torch.stack(val_cols, 1), order))


def sampled_chain_many(seqs: list[EagleSequence], ks: list[int], params: list[SamplingParams],
                       first_positions: list[int], top_k: int = 16) -> list[Draft]:
    """`sampled_chain_rows` as Drafts: the tokens and their q rows come back in one copy for
    the whole batch."""
    rows = sampled_chain_rows(seqs, ks, params, first_positions, top_k)
    (tokens, ids), (vals,) = seqs[0].head.fetch(list(rows[:2]), [rows[2]])
    return [sampled_draft(tokens[i, :k], ids[i, :k], vals[i, :k]) for i, k in enumerate(ks)]


def sampling_settings(params: list[SamplingParams]) -> tuple[torch.Tensor, ...]:
    """Rows' (temperature, top-k, top-p, min-p) as the host tensors apply_sampling_params
    reads, one entry per row."""
    return (torch.tensor([p.temperature for p in params], dtype=torch.float32),
            torch.tensor([p.top_k for p in params], dtype=torch.int64),
            torch.tensor([p.top_p for p in params], dtype=torch.float32),
            torch.tensor([p.min_p for p in params], dtype=torch.float32))


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _stack(rows: list[torch.Tensor]) -> torch.Tensor:
    return rows[0][None] if len(rows) == 1 else torch.stack(rows)


def unrank(ranked: torch.Tensor, order: list[int]) -> torch.Tensor:
    """Rows in ranked order (row r is sequence order[r]) back in the sequences' order."""
    back = [0] * len(order)
    for r, i in enumerate(order):
        back[i] = r
    if back == list(range(len(order))):
        return ranked
    return ranked.index_select(0, to_device(torch.tensor(back), ranked.device))


def _step_many(seqs: list[EagleSequence], tokens: torch.Tensor, hidden: torch.Tensor,
               depth: int) -> torch.Tensor:
    """Feed one drafted token per sequence (target ids [m]) with the hidden state that predicted
    it [m, H] as each one's scratch row `depth` (1-based) past its root; their outputs [m, H]."""
    head = seqs[0].head
    cols = [s.scratch_column(depth) for s in seqs]
    for s, col in zip(seqs, cols):
        s._reserve(col + 1)
    if len(seqs) == 1:
        pos = torch.full((1, 1), cols[0], device=head.device)
    else:
        pos = to_device(torch.tensor([cols]), head.device)

    def attend(q, k, v):
        parts = []
        for r, (s, col) in enumerate(zip(seqs, cols)):
            s._write(col, k[:, :, r:r + 1], v[:, :, r:r + 1])
            parts.append(head.attention(q[:, :, r:r + 1], s.keys[:, :, :col + 1],
                                        s.values[:, :, :col + 1], None))
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    return head.layer(tokens[None], hidden[None], pos, attend, max(cols) + 1)[0]


def sampled_draft(tokens: torch.Tensor, ids: torch.Tensor, vals: torch.Tensor) -> Draft:
    """A sampled chain as sent, from host copies of its tokens [k] and each token's truncated
    q (target ids, probabilities [k, K]; entries of probability 0 are padding)."""
    keep = vals > 0  # the q rows as sent: each token's support, its probabilities
    rows = [(ids[i][keep[i]].tolist(), vals[i][keep[i]].tolist()) for i in range(len(tokens))]
    return Draft("", tokens.tolist(), q=SparseProbs.from_rows(rows))


def tree_mask(state: TreeState, base: int, level: int) -> torch.Tensor:
    """Which columns level - 1's frontier rows see when fed: every committed column (before
    `base`) and, among the fed rows, each row's own ancestors and itself. [1, 1, k, span]."""
    k = state.top_k
    span = base + (level - 1) * k
    seen = torch.ones(k, span, dtype=torch.bool, device=state.ancestors.device)
    seen[:, base:] = state.ancestors[:, :(level - 1) * k]
    return seen[None, None]
