"""Logit processing and per-row sampling, shared by the verifier and sampling proposers.

The verifier turns target logits into target probabilities p with `apply_sampling_params`, and a
sampling proposer turns its draft logits into q with the very same function, so p and q are shaped
by identical temperature / top-k / top-p / min-p rules. That is what keeps rejection sampling
lossless with respect to the *processed* target distribution.

Processing order (per row):
    1. temperature: temperature == 0 means greedy -> one-hot at argmax(logits); otherwise
       logits / T.
    2. top-k: keep the k largest logits (ties with the k-th value are kept); k <= 0 means off.
    3. top-p: keep the smallest prefix of the sorted distribution whose mass reaches top_p
       (the most likely token is always kept); top_p >= 1 means off.
    4. min-p: drop tokens whose probability (after 1-3, renormalised) is below min_p * max prob;
       min_p <= 0 means off.

Sampling uses the exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) i.i.d. picks i with
probability p_i / sum(p), needs no normalisation and no cumulative sum, and draws a fixed number of
random values per row (vocab uniforms, E = -log(U)). Unseeded rows draw from the default RNG; a
seeded row's noise is a pure function of (seed, position) (`noise_key`, `keyed_exponentials`), so
its token depends neither on the rest of the batch nor on how many numbers were drawn before.

Per-row parameter tensors may live on the CPU (recommended): then "is any row using top-k?" style
checks are free and skip work; when they live on the device the checks are skipped (all stages run,
which is still correct, and never forces a host-device sync).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

MIN_TEMPERATURE = 0.01  # a sampled row's temperature is at least this (vLLM's floor too)

__all__ = [
    "MIN_TEMPERATURE",
    "SamplingTensors",
    "apply_sampling_params",
    "draw_exponentials",
    "keyed_argmax",
    "key_halves",
    "keyed_exponentials",
    "keyed_exponentials_at",
    "noise_key",
    "race",
    "sample",
    "sample_static",
    "truncate",
]


@dataclass(frozen=True)
class SamplingTensors:
    """Per-row sampling parameters in the layout `apply_sampling_params` expects (CPU tensors)."""

    temperature: torch.Tensor  # float32 [N]; 0 = greedy
    top_k: torch.Tensor  # int64 [N]; <= 0 = off
    top_p: torch.Tensor  # float32 [N]; >= 1 = off
    min_p: torch.Tensor  # float32 [N]; <= 0 = off

    @classmethod
    def from_lists(
        cls,
        temperature: Sequence[float],
        top_k: Optional[Sequence[int]] = None,
        top_p: Optional[Sequence[float]] = None,
        min_p: Optional[Sequence[float]] = None,
    ) -> "SamplingTensors":
        n = len(temperature)
        return cls(
            temperature=torch.tensor(list(temperature), dtype=torch.float32),
            top_k=torch.tensor(list(top_k) if top_k is not None else [0] * n, dtype=torch.int64),
            top_p=torch.tensor(
                list(top_p) if top_p is not None else [1.0] * n, dtype=torch.float32
            ),
            min_p=torch.tensor(
                list(min_p) if min_p is not None else [0.0] * n, dtype=torch.float32
            ),
        )

    @property
    def is_greedy(self) -> torch.Tensor:
        return self.temperature == 0  # bool [N]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return apply_sampling_params(logits, self.temperature, self.top_k, self.top_p, self.min_p)


def _host_any(mask: torch.Tensor) -> bool:
    """True when some row might need the stage. Free for CPU tensors; never syncs a device."""
    if mask.device.type == "cpu":
        return bool(mask.any())
    return True


def _effective_top_k(top_k: torch.Tensor, vocab: int, device: torch.device) -> torch.Tensor:
    """top_k [N] with "off" (<= 0) and oversized values mapped to vocab, on the logits' device."""
    k = top_k.to(device=device, dtype=torch.int64, non_blocking=True)
    return torch.where(k > 0, k, torch.full_like(k, vocab)).clamp(max=vocab)


def _mask_below_kth(x: torch.Tensor, k: torch.Tensor, top_k_host: torch.Tensor,
                    static: bool = False) -> torch.Tensor:
    """-inf below each row's k-th largest value (ties with it are kept). x: [N, V]; k: [N]."""
    vocab = x.shape[1]
    if top_k_host.device.type == "cpu" and not static:
        k_max = int(
            torch.where(top_k_host > 0, top_k_host, torch.full_like(top_k_host, vocab))
            .clamp(max=vocab)
            .max()
        )
        top_vals = x.topk(k_max, dim=-1).values  # [N, k_max], descending
    else:
        top_vals = x.sort(dim=-1, descending=True).values
    kth = top_vals.gather(1, (k - 1).unsqueeze(1))  # [N, 1]
    return x.masked_fill(x < kth, float("-inf"))


def apply_sampling_params(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    static: bool = False,
) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p (in that order) -> float32 probabilities [N, V].

    logits: [N, V] float; temperature float32 [N] (0 = greedy: one-hot at argmax(logits));
    top_k int64 [N] (<= 0 off); top_p float32 [N] (>= 1 off); min_p float32 [N] (<= 0 off).
    static: every stage runs, at fixed shapes, reading nothing back, whatever the device (what
    a captured graph records; else CPU tensors skip the stages no row needs and sort only what
    top-k leaves).
    """
    # logits: [N, V]
    n, vocab = logits.shape
    device = logits.device
    x = logits.to(torch.float32)

    use_top_k = static or _host_any((top_k > 0) & (top_k < vocab))
    use_top_p = static or _host_any(top_p < 1.0)
    use_min_p = static or _host_any(min_p > 0.0)
    any_greedy = static or _host_any(temperature == 0)

    temp = temperature.to(device=device, dtype=torch.float32, non_blocking=True)
    greedy = temp == 0  # [N]
    # greedy rows are divided by 1 and overwritten with a one-hot at the end; a temperature
    # below MIN_TEMPERATURE samples at it (dividing by 1e-38 overflows every logit to inf)
    x = x / torch.where(greedy, torch.ones_like(temp), temp.clamp(min=MIN_TEMPERATURE)
                        ).unsqueeze(1)

    if use_top_p:
        if use_top_k:
            k = _effective_top_k(top_k, vocab, device)
            x = _mask_below_kth(x, k, top_k, static)  # ties with the k-th value are kept
        # sort only what can survive: on the CPU, when every row has top-k, the survivors of the
        # top-k mask (counted exactly, ties included) bound the sort width; else a full sort
        width = vocab
        if use_top_k and logits.device.type == "cpu" and not static and bool((top_k > 0).all()):
            width = int((x > float("-inf")).sum(dim=-1).max())
        x_sorted, order = (
            x.topk(width, dim=-1) if width < vocab else x.sort(dim=-1, descending=True)
        )
        p_sorted = x_sorted.softmax(dim=-1)  # [N, width]
        # mass strictly before each token; drop a token once that mass already reaches top_p
        mass_before = p_sorted.cumsum(dim=-1) - p_sorted
        tp = top_p.to(device=device, dtype=torch.float32, non_blocking=True).unsqueeze(1)
        drop = (mass_before >= tp) & (tp < 1.0)
        drop[:, 0] = False  # the most likely token always survives
        x_sorted = x_sorted.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter_(1, order, x_sorted)
    elif use_top_k:
        x = _mask_below_kth(x, _effective_top_k(top_k, vocab, device), top_k, static)

    probs = x.softmax(dim=-1)  # [N, V]
    if use_min_p:
        mp = min_p.to(device=device, dtype=torch.float32, non_blocking=True).unsqueeze(1)
        # min-p: keep p_i >= min_p * max_j p_j, then renormalise; a row without min-p keeps
        # its p bit for bit (as where the stage is skipped: static and skipping paths agree)
        keep = probs >= mp * probs.amax(dim=-1, keepdim=True)
        kept = torch.where(keep, probs, torch.zeros_like(probs))
        probs = torch.where(mp > 0, kept / kept.sum(dim=-1, keepdim=True), probs)

    if any_greedy:
        one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(1), one_hot, probs)
    return probs


def draw_exponentials(num_rows: int, vocab: int, device: torch.device) -> torch.Tensor:
    """Exp(1) noise [num_rows, vocab] from the default RNG, as E = -log(U), U ~ U[0, 1).

    -log(U) is several times cheaper than Tensor.exponential_ on CPU; U = 0 gives E = inf, which
    removes that token from one draw with probability 2**-24, far below anything measurable.
    """
    exps = torch.empty(num_rows, vocab, dtype=torch.float32, device=device).uniform_()
    # E = -log(U) > 0 for U < 1, so p / E never divides by zero
    return exps.log_().neg_()


# -- truncated draws: a sampled draft token and the q it is sent with -------------------------

def truncate(q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [n, V] -> its k likeliest entries renormalised (probabilities [n, k], token ids
    [n, k]): the truncated q a sampled draft token is drawn from, and sent with it."""
    vals, idx = q.topk(k, dim=-1)
    return vals / vals.sum(dim=-1, keepdim=True), idx


def race(vals: torch.Tensor, idx: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The exponential race over a truncated q: argmax(q / E) with E ~ Exp(1) per entry is a
    draw from q. vals, idx, noise [n, K] -> the chosen token ids [n]."""
    picks = (vals / noise).argmax(dim=-1, keepdim=True)
    return idx.gather(1, picks)[:, 0]


# -- keyed noise: a seeded request's random numbers as a function of (seed, position) ----------

_MASK32 = 0xFFFFFFFF
# odd multipliers below 2**31: a 32-bit value times one stays below 2**63, so int64 never wraps
_MUL1, _MUL2 = 0x7FEB352D, 0x2C1B3C6D


def noise_key(seed: int, position: int) -> int:
    """The 64-bit key of the noise that picks the token at `position` of a request seeded `seed`.

    Every random number a seeded request consumes is keyed by where it is used, never by how many
    were drawn before: a dropped draft, another batch, another k, a preemption or a resume on
    another replica all see the same numbers. The draft proposers key their own sampling the same
    way, which couples their drafts with the verifier's choice (higher acceptance)."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MUL1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & _MASK32
    return x ^ (x >> 16)


def key_halves(keys: Sequence[int]) -> torch.Tensor:
    """Noise keys as int64 [N, 2] (low, high 32 bits): what `keyed_exponentials_at` reads, built
    on the host once and moved to the device with the rest of a step's inputs."""
    return torch.tensor([[key & _MASK32, key >> 32] for key in keys], dtype=torch.int64)


def keyed_exponentials(keys: Sequence[int], index: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise at token ids `index` [N, K] for rows keyed `keys` (N ints) -> float32 [N, K].

    A pure function of (key, token id), integer arithmetic only, so it gives the same numbers on
    every device and in every process: E(key, v) = -log(U), U from 24 hashed bits."""
    return keyed_exponentials_at(key_halves(keys).to(index.device, non_blocking=True), index)


def keyed_exponentials_at(halves: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`keyed_exponentials` with the keys as `key_halves` [N, 2] on index's device: no host
    value read (a drafting loop computes it every iteration on the device)."""
    # index: [N, K]
    lo, hi = halves.unbind(1)  # [N] each
    v = index.to(torch.int64)
    h = _mix32(_mix32(v ^ hi.unsqueeze(1)) ^ lo.unsqueeze(1))
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # in (0, 1)
    return u.log_().neg_()


def keyed_argmax(probs: torch.Tensor, keys: Sequence[int]) -> torch.Tensor:
    """The exponential race over probs [N, V] with keyed noise -> int64 [N]: a sample of each row
    that depends only on (row, key)."""
    vocab = probs.shape[1]
    index = torch.arange(vocab, device=probs.device).expand(probs.shape[0], vocab)
    return (probs.to(torch.float32) / keyed_exponentials(keys, index)).argmax(dim=-1)


def sample_static(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                  top_p: torch.Tensor, min_p: torch.Tensor, keyed: torch.Tensor,
                  halves: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One token per row of logits [N, V] from the row's parameters, all on the device, at
    fixed shapes, reading nothing back (what a captured graph records): a greedy row
    (temperature 0) its argmax; a keyed row (keyed [N] > 0) the exponential race with its keyed
    noise (`key_halves` [N, 2]), the very token `keyed_argmax` picks from the same p; any other
    row the race with `noise` [N, V] (Exp(1)) -> int64 [N]."""
    probs = apply_sampling_params(logits, temperature, top_k, top_p, min_p, static=True)
    n, vocab = probs.shape
    index = torch.arange(vocab, device=probs.device).expand(n, vocab)
    exps = torch.where(keyed.unsqueeze(1) > 0, keyed_exponentials_at(halves, index), noise)
    raced = (probs / exps).argmax(dim=-1)
    return torch.where(temperature == 0, logits.argmax(dim=-1), raced)


def sample(probs: torch.Tensor, keys: Optional[Sequence[Optional[int]]] = None) -> torch.Tensor:
    """One token per row of probs [N, V] (rows need not be normalised) -> int64 [N].

    keys[i] is a noise key (`noise_key(seed, position)`: a seeded row, reproducible anywhere) or
    None (the default RNG). keys=None: every row uses the default RNG.
    """
    # probs: [N, V]
    n, vocab = probs.shape
    keys = [None] * n if keys is None else list(keys)
    if len(keys) != n:
        raise ValueError(f"keys has {len(keys)} entries for {n} rows")
    # exponential race: P(argmax_i p_i / E_i = i) = p_i / sum_j p_j
    out = (probs.to(torch.float32) / draw_exponentials(n, vocab, probs.device)).argmax(dim=-1)
    keyed = [i for i, key in enumerate(keys) if key is not None]
    if keyed:
        rows = torch.tensor(keyed, device=probs.device)
        out[rows] = keyed_argmax(probs[rows], [keys[i] for i in keyed])
    return out
