"""How the learned proposers (draft model, MLP speculator) turn draft logits into draft tokens.

Greedy requests (temperature 0): argmax, sent as token ids only (one-hot). Sampled requests:
q = apply_sampling_params(draft logits, the request's own temperature/top-k/top-p/min-p), the same
processing the verifier applies to the target's p; q is truncated to its top-K entries and
renormalised, the token is drawn from that truncated q, and exactly that sparse q is sent, so
rejection sampling stays lossless (truncation costs acceptance, never correctness).

Seeded requests draw with the verifier's keyed noise (kernels.sampling.noise_key): the draft for
position t is argmax(q / E(seed, t)) over q's support, E at those very token ids. The verifier
emits argmax(p / E(seed, t)) for a seeded request whatever is drafted, so the shared noise is what
makes the two agree when q is close to p; and a draft depends only on (seed, position), never on
restarts, resyncs or batch composition.
"""

from __future__ import annotations

from typing import Sequence

import torch

from kernels.sampling import (
    apply_sampling_params,
    draw_exponentials,
    key_halves,
    keyed_exponentials_at,
    noise_key,
    race,
    truncate,
)
from splitspec.params import SamplingParams

Row = tuple[list[int], list[float]]  # one draft token's sparse q: (token ids, probabilities)


def offsets_wanted(params: Sequence[SamplingParams]) -> bool:
    """Whether some row has a logit bias or allowed token ids (`logit_offsets` is not None)."""
    return any(p.logit_bias or p.allowed_token_ids for p in params)


def logit_offsets(params: Sequence[SamplingParams], vocab: int, device: torch.device
                  ) -> torch.Tensor | None:
    """What each row's draft logits get added [B, V]: its logit_bias, and -inf outside its
    allowed_token_ids: the verifier's processors that need no history (kernels/
    logits_processors.py), so a drafter proposes what the biased or masked target prefers.
    The penalties, which need each drafted position's own history, are left to the verifier:
    a draft only decides how many tokens a step keeps, never which. None: no row has either."""
    if not offsets_wanted(params):
        return None
    out = torch.zeros(len(params), vocab)
    for r, p in enumerate(params):
        if p.allowed_token_ids:
            allowed = torch.tensor([t for t in p.allowed_token_ids if t < vocab],
                                   dtype=torch.long)
            out[r].fill_(float("-inf")).index_fill_(0, allowed, 0.0)
        for token, bias in p.logit_bias:
            if token < vocab:
                out[r, token] += bias
    return out.to(device, non_blocking=True)


def draft_keys(params: Sequence[SamplingParams], positions: Sequence[int]) -> list[int | None]:
    """The noise key of each row's next draft token (None: greedy or unseeded)."""
    return [None if p.greedy or p.seed is None else noise_key(p.seed, pos)
            for p, pos in zip(params, positions)]


class DraftChooser:
    """Chooses every row's draft token on the device, iteration after iteration, reading nothing
    back: what a drafting loop calls once per drafted position (its tokens are fed back as the
    next iteration's input where they are, and copied out once at the end).

    Everything the host decides is decided at construction, for all `iterations` at once: which
    rows sample, their parameters, and their random numbers: the Exp(1) noise of unseeded rows
    drawn up front from the default RNG, the keyed noise of seeded rows as key tensors (computed
    at the chosen token ids on the device). keys[j][i]: row i's noise key at iteration j (None:
    greedy or unseeded)."""

    def __init__(self, params: Sequence[SamplingParams], keys: Sequence[Sequence[int | None]],
                 top_k: int, vocab: int, device: torch.device, guess_row: int | None = None):
        self.b = len(params)
        self.rows = [i for i, p in enumerate(params) if not p.greedy]
        self.k = min(top_k, vocab)
        self.device = device
        # the guessed row (see draft_loop) takes its mode at iteration 0 unless keyed
        self.guess = (guess_row if guess_row is not None and keys and keys[0][guess_row] is None
                      else None)
        if not self.rows:
            return
        sel = [params[i] for i in self.rows]
        self.temperature = torch.tensor([p.temperature for p in sel], dtype=torch.float32)
        self.top_k = torch.tensor([p.top_k for p in sel], dtype=torch.int64)
        self.top_p = torch.tensor([p.top_p for p in sel], dtype=torch.float32)
        self.min_p = torch.tensor([p.min_p for p in sel], dtype=torch.float32)
        self.row_index = torch.tensor(self.rows).to(device, non_blocking=True)
        n, iters = len(self.rows), len(keys)
        # unseeded rows' noise for every iteration, drawn now; seeded rows' keys
        self.noise = draw_exponentials(iters * n, self.k, device).view(iters, n, self.k)
        keyed = [[keys[j][i] for i in self.rows] for j in range(iters)]
        self.keyed_rows = [r for r in range(n) if keyed and keyed[0][r] is not None]
        if self.keyed_rows:
            self.keyed_index = torch.tensor(self.keyed_rows).to(device, non_blocking=True)
            self.halves = key_halves([keyed[j][r] for j in range(iters)
                                      for r in self.keyed_rows]).view(
                iters, len(self.keyed_rows), 2).to(device, non_blocking=True)

    def __call__(self, logits: torch.Tensor, j: int
                 ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """logits [B, V] of iteration j -> tokens [B] (int64, on the device) and, when rows
        sample, their truncated q as (token ids [n, K], probabilities [n, K]) in self.rows
        order (entries of probability 0 are padding)."""
        tokens = logits.argmax(dim=-1)  # greedy rows: argmax
        if not self.rows:
            return tokens, None
        q = apply_sampling_params(logits.index_select(0, self.row_index).float(),
                                  self.temperature, self.top_k, self.top_p, self.min_p)
        vals, idx = truncate(q, self.k)  # [n, K]
        noise = self.noise[j]
        if self.keyed_rows:  # seeded rows: keyed noise at the very token ids
            keyed = keyed_exponentials_at(self.halves[j], idx.index_select(0, self.keyed_index))
            noise = noise.index_copy(0, self.keyed_index, keyed)
        chosen = race(vals, idx, noise)
        if j == 0 and self.guess is not None:
            chosen = torch.where(self.row_index == self.guess, tokens.index_select(
                0, self.row_index), chosen)
        return tokens.index_copy(0, self.row_index, chosen), (idx, vals)

    def rows_q(self, idx: list, vals: list) -> list[Row | None]:
        """Host copies of one iteration's (ids, probabilities) -> each row's sparse q (None for
        greedy rows), zero-probability entries dropped."""
        out: list[Row | None] = [None] * self.b
        for r, i in enumerate(self.rows):
            out[i] = sparse_row(idx[r], vals[r])
        return out


def sparse_row(ids: list[int], probs: list[float]) -> Row:
    """One drafted position's truncated q as sent, from host copies of its fixed-width
    (token ids, probabilities): the entries of probability 0 (padding) dropped."""
    keep = [(t, v) for t, v in zip(ids, probs) if v > 0]
    return [t for t, _ in keep], [v for _, v in keep]


def choose_static(logits: torch.Tensor, inputs: dict[str, torch.Tensor], halves: torch.Tensor,
                  noise: torch.Tensor, k: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DraftChooser's choice for every row of logits [B, V] at once, from fixed-shape device
    inputs (what a captured drafting iteration runs; the same numbers per row as the chooser):
    inputs' temperature, top_k, top_p, min_p [B] (temperature 0: greedy) and keyed [B]
    (1: seeded); this position's noise keys of the seeded rows, halves [B, 2], and Exp(1) noise
    of the unseeded ones [B, K]. Returns tokens [B] and the truncated q (token ids,
    probabilities [B, K]; a greedy row's is its one-hot)."""
    q = apply_sampling_params(logits.float(), inputs["temperature"], inputs["top_k"],
                              inputs["top_p"], inputs["min_p"], static=True)
    vals, idx = truncate(q, k)
    keyed = inputs["keyed"].bool()[:, None]
    chosen = race(vals, idx, torch.where(keyed, keyed_exponentials_at(halves, idx), noise))
    greedy = inputs["temperature"] == 0
    return torch.where(greedy, logits.argmax(dim=-1), chosen), idx, vals


def choose_tokens(logits: torch.Tensor, params: Sequence[SamplingParams],
                  keys: Sequence[int | None], top_k: int) -> tuple[list[int], list[Row | None]]:
    """One draft token per row of logits [B, V] (host lists), and the sparse q it was drawn from
    (None for greedy rows): one DraftChooser iteration."""
    chooser = DraftChooser(params, [keys], top_k, logits.shape[-1], logits.device)
    tokens, q = chooser(logits, 0)
    if q is None:
        return tokens.tolist(), [None] * len(params)
    return tokens.tolist(), chooser.rows_q(q[0].tolist(), q[1].tolist())
