"""MLP speculator: a multi-head, recurrent MLP that drafts tokens from the target's hidden state.

This is the model of IBM's accelerator checkpoints (`ibm-fms/*-accelerator`,
`ibm-granite/*-accelerator`, arXiv 2404.19124), the format vLLM and TGI load, and the format the
project's own speculator is stored in. Head ``i`` keeps a running state:

    s_0   = ln0(h_t) / sqrt(2)  if scale_input, else h_t    # h_t: target's final state [B, H]
    # x_{t+1}: the token the target just emitted
    s_i+1 = GELU(ln_i(a * proj_i(s_i) + b * emb_i[x_{t+1+i}]))
    logits_i = head_i(s_i+1)                                 # predicts x_{t+2+i}

with ``a = 0.5 ** (0.5 / n_predict)`` and ``b = sqrt((1 - a^2) * inner_dim / 2)``, so that in
expectation the target's state still makes up about half of the state at the last head. The norms
are RMS-style, not mean-centred: ``x * rsqrt(mean(x^2) + 1e-6)``, then a learned per-channel scale
and shift for ``ln_i``, and neither for ``ln0`` (which has no weights in the file).

``tie_weights`` shares one embedding, one norm and one output head across all heads, and one
projection across heads 1.. (head 0's maps the target's width, emb_dim, to inner_dim). A tied file
holds index 0 of each (and ``proj.1``); copies of the shared tensors under other indices are
accepted when they are equal. The shared head also lets the recurrence run past ``n_predict``
steps; quality decays with depth, so callers should prefer k <= n_predict.

A chain: each head takes the top-1 (or one sampled) token and feeds it to the next. A tree
(``generate_tree``), as the format's ``top_k_tokens_per_head`` / ``n_candidates`` describe it:
head i expands every kept node at depth i by its top-b tokens, each conditioned on that node's own
token and state (``step`` takes any leading shape: one row per open node), and the nodes kept are
the best by cumulative log-probability within a node budget (proposer_service/tree_builder.py).
The branching b is the caller's (the request's max_branch), not the checkpoint's
``top_k_tokens_per_head``, which the accelerator checkpoints set for their own serving budget.
With b = 1 the tree is the greedy chain.

The config and file layout are in proposer_service/mlp/checkpoint.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.vocab_subset import SubsetHead, SubsetHeadModule
from proposer_service.mlp.checkpoint import (
    CONFIG_NAME,
    MODEL_TYPE,
    WEIGHTS_NAME,
    MLPSpeculatorConfig,
    read_state_dict,
)
from proposer_service.tree_builder import reindex, select

__all__ = ["CONFIG_NAME", "MODEL_TYPE", "WEIGHTS_NAME", "MLPSpeculator", "MLPSpeculatorConfig",
           "SpeculatorNorm"]

NORM_EPS = 1e-6  # the format's epsilon inside the rsqrt


class SpeculatorNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) over the last dim (no mean subtraction), then an optional learned
    scale and shift. Computed in float32 so that fp16 states do not overflow the mean of squares."""

    def __init__(self, dim: int, affine: bool = True, eps: float = NORM_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
        if self.weight is not None:
            y = y * self.weight + self.bias
        return y


class MLPSpeculator(nn.Module):
    def __init__(self, config: MLPSpeculatorConfig):
        super().__init__()
        self.config = c = config
        # tied: one shared module (stored as index 0); proj[0] maps emb_dim -> inner_dim and the
        # rest inner_dim -> inner_dim (one shared proj[1] when tied)
        n_shared = 1 if c.tie_weights else c.n_predict
        n_proj = 2 if c.tie_weights else c.n_predict
        self.emb = nn.ModuleList(nn.Embedding(c.vocab_size, c.inner_dim) for _ in range(n_shared))
        self.proj = nn.ModuleList(
            nn.Linear(c.emb_dim if i == 0 else c.inner_dim, c.inner_dim, bias=False)
            for i in range(n_proj)
        )
        self.ln = nn.ModuleList(SpeculatorNorm(c.inner_dim) for _ in range(n_shared))
        self.head = nn.ModuleList(
            nn.Linear(c.inner_dim, c.vocab_size, bias=False) for _ in range(n_shared)
        )
        self.ln0 = SpeculatorNorm(c.emb_dim, affine=False) if c.scale_input else None
        self.state_weight = 0.5 ** (0.5 / c.n_predict)
        self.emb_weight = math.sqrt((1 - self.state_weight**2) * (c.inner_dim / 2))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        c = self.config
        for e in self.emb:
            nn.init.normal_(e.weight, 0.0, 1.0 / math.sqrt(c.inner_dim))
        for p in self.proj:
            nn.init.normal_(p.weight, 0.0, 1.0 / math.sqrt(p.in_features))
        for h in self.head:
            nn.init.normal_(h.weight, 0.0, 1.0 / math.sqrt(c.inner_dim))
        for ln in self.ln:
            nn.init.ones_(ln.weight)
            nn.init.zeros_(ln.bias)

    def restrict_vocab(self, ids: torch.Tensor, backend: str = "dense") -> None:
        """For inference: every head scores only the tokens `ids` (the others' logits are -inf;
        kernels/vocab_subset.py), its rows packed for `backend` (kernels/linear.py)."""
        for i, h in enumerate(self.head):
            self.head[i] = SubsetHeadModule(SubsetHead(h.weight, ids, backend))

    # head i -> index into the (possibly shared) module lists; steps past n_predict reuse the last
    def _idx(self, i: int, n: int) -> int:
        return min(i, n - 1)

    @property
    def max_steps(self) -> int:
        """How many tokens one call can draft (unbounded recurrence when tied; capped at 8 by
        convention)."""
        return max(self.config.n_predict, 8) if self.config.tie_weights else self.config.n_predict

    def input_state(self, hidden: torch.Tensor) -> torch.Tensor:
        """The state head 0 projects: [..., emb_dim] -> [..., emb_dim]."""
        if self.ln0 is not None:
            hidden = self.ln0(hidden) / math.sqrt(2)
        return hidden

    def step(
        self, state: torch.Tensor, token: torch.Tensor, i: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One head: state [..., D_in], token [...] -> (new state [..., inner], logits [..., V])."""
        z = self.emb[self._idx(i, len(self.emb))](token)  # [..., inner]
        s = self.proj[self._idx(i, len(self.proj))](state)  # [..., inner]
        s = self.state_weight * s + self.emb_weight * z
        s = F.gelu(self.ln[self._idx(i, len(self.ln))](s))
        return s, self.head[self._idx(i, len(self.head))](s)

    def forward(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits of every head.

        hidden: [B, T, H] target states at positions t; tokens: [B, T, n] where tokens[..., i] is
        x_{t+1+i} (the token head i conditions on). Returns [n, B, T, V]: head i predicts x_{t+2+i}.
        """
        state = self.input_state(hidden)
        out = []
        for i in range(tokens.shape[-1]):
            state, logits = self.step(state, tokens[..., i], i)
            out.append(logits)
        return torch.stack(out, 0)

    # ---- training helpers (sequence layout: s [B, L] tokens, h [B, T, H] states at positions
    # lo..hi-1)

    def teacher_forced_logits(
        self, h: torch.Tensor, s: torch.Tensor, lo: int, hi: int
    ) -> list[torch.Tensor]:
        n = self.config.n_predict
        toks = torch.stack([s[:, lo + 1 + i : hi + 1 + i] for i in range(n)], -1)  # [B, T, n]
        return list(self.forward(h, toks))

    def training_losses(
        self,
        h: torch.Tensor,
        s: torch.Tensor,
        lo: int,
        hi: int,
        next_tokens: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Per-head cross entropy over positions t in [lo, hi).

        Head i at t conditions on s[t+1..t+1+i]. Its label is next_tokens[t+1+i] when given (e.g.
        the target's own argmax after the prefix s[:t+2+i], which is what greedy verification
        accepts), else the next token of the sequence, s[t+2+i].
        """
        losses = []
        for i, lg in enumerate(self.teacher_forced_logits(h, s, lo, hi)):
            y = (
                s[:, lo + 2 + i : hi + 2 + i]
                if next_tokens is None
                else next_tokens[:, lo + 1 + i : hi + 1 + i]
            )
            losses.append(F.cross_entropy(lg.float().reshape(-1, lg.size(-1)), y.reshape(-1)))
        return losses

    # ---- inference

    @torch.no_grad()
    def generate_suggestions(
        self, hidden: torch.Tensor, last_token: torch.Tensor, k: int | None = None
    ) -> torch.Tensor:
        """Greedy draft (the top-1 path). hidden [B, H] (target state that produced last_token),
        last_token [B] -> [B, k]."""
        k = self.config.n_predict if k is None else k
        if k > self.max_steps:
            raise ValueError(f"k={k} exceeds what this speculator can draft ({self.max_steps})")
        state = self.input_state(hidden.to(self.head[0].weight.dtype))
        tok = last_token
        out = []
        for i in range(k):
            state, logits = self.step(state, tok, i)
            tok = logits.argmax(-1)
            out.append(tok)
        return torch.stack(out, -1)

    @torch.no_grad()
    def generate_tree(
        self, hidden: torch.Tensor, last_token: torch.Tensor, budgets: list[int],
        branches: list[int], max_depth: int | None = None,
    ) -> list[tuple[list[int], list[int]]]:
        """Per row a draft tree (tokens, parents): hidden [B, H] (target state that produced
        last_token), last_token [B]; row b keeps at most budgets[b] nodes, at most branches[b]
        children per node, at most max_depth (default max_steps) deep."""
        depth_cap = min(self.max_steps if max_depth is None else max_depth, self.max_steps)
        B = hidden.shape[0]
        # per row, the nodes kept so far: tokens, parents, cumulative log-probabilities
        toks: list[list[int]] = [[] for _ in range(B)]
        pars: list[list[int]] = [[] for _ in range(B)]
        scores: list[list[float]] = [[] for _ in range(B)]
        state = self.input_state(hidden.to(self.head[0].weight.dtype))  # [R, H], R open nodes
        tok = last_token  # [R]
        rows, nodes = list(range(B)), [-1] * B  # per open node: its row, its index (-1: root)
        for i in range(depth_cap):
            if not rows:
                break
            state, logits = self.step(state, tok, i)  # [R, inner], [R, V]
            width = min(max(branches[b] for b in rows), logits.shape[-1])
            top_lp, top_id = torch.log_softmax(logits.float(), -1).topk(width, -1)  # [R, width]
            top_lp, top_id = top_lp.tolist(), top_id.tolist()
            born: list[list[tuple[int, int]]] = [[] for _ in range(B)]  # (node, open row)
            for r, (b, n) in enumerate(zip(rows, nodes)):
                base = 0.0 if n < 0 else scores[b][n]
                for j in range(min(branches[b], width)):
                    born[b].append((len(toks[b]), r))
                    toks[b].append(top_id[r][j])
                    pars[b].append(n)
                    scores[b].append(base + top_lp[r][j])
            rows, nodes, src = [], [], []
            for b in range(B):
                if not born[b]:
                    continue
                # a node cut now never comes back (children score no higher than their parent),
                # so only kept nodes are remembered and only new kept ones expand
                kept = select(pars[b], scores[b], budgets[b], branches[b])
                at = {c: j for j, c in enumerate(kept)}
                toks[b], pars[b] = reindex(toks[b], pars[b], kept)
                scores[b] = [scores[b][c] for c in kept]
                if i + 1 < depth_cap:
                    for c, r in born[b]:
                        if c in at:
                            rows.append(b)
                            nodes.append(at[c])
                            src.append(r)
            state = state[src]
            tok = torch.tensor([toks[b][n] for b, n in zip(rows, nodes)], dtype=torch.long,
                               device=last_token.device)
        return list(zip(toks, pars))

    @torch.no_grad()
    def sample_suggestions(
        self,
        hidden: torch.Tensor,
        last_token: torch.Tensor,
        k: int | None = None,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled draft. Returns (tokens [B, k], probs [B, k, V]): the exact q each token was
        drawn from."""
        k = self.config.n_predict if k is None else k
        if k > self.max_steps:
            raise ValueError(f"k={k} exceeds what this speculator can draft ({self.max_steps})")
        state = self.input_state(hidden.to(self.head[0].weight.dtype))
        tok = last_token
        toks, probs = [], []
        for i in range(k):
            state, logits = self.step(state, tok, i)
            q = torch.softmax(logits.float() / max(temperature, 1e-6), -1)
            tok = torch.multinomial(q, 1, generator=generator).squeeze(-1)
            toks.append(tok)
            probs.append(q)
        return torch.stack(toks, -1), torch.stack(probs, 1)

    # ---- persistence (the accelerators' layout: config.json + model.safetensors)

    def save_pretrained(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        dtype = next(self.parameters()).dtype
        self.config.dtype = str(dtype).removeprefix("torch.")
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(path / WEIGHTS_NAME), metadata={"format": "pt"})
        (path / CONFIG_NAME).write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
    ) -> "MLPSpeculator":
        path = Path(path)
        config = MLPSpeculatorConfig.from_file(path / CONFIG_NAME)
        model = cls(config)
        state = read_state_dict(path, config, expected=model.state_dict())
        model.load_state_dict(state, strict=True)
        model.to(device=device, dtype=dtype or getattr(torch, config.dtype))
        model.eval()
        return model
