"""The sampler of a step that verifies nothing (speculation off, or every draft dropped) where a
row samples: `kernels.sampling.sample_static` over static buffers, replayed as one captured
graph per batch bucket on a device that captures.

After a captured forward, the eager sampler is some fifty small launches per step (the sampling
parameters' stages, the keyed noise's integer hashing over the vocabulary, the race); on a GPU
they cost more than the forward of a small target. Here they are one replay, with the step's
logits rows and each row's parameters copied in (two pinned copies) and fresh Exp(1) noise drawn
on the device only when an unseeded sampled row needs it.

A seeded row gets the token the rejection sampler's coupled verification emits at the same
position (the keyed race over the same p: `apply_sampling_params` with every stage run gives
the same p bit for bit), so seeded output stays the same on and off. Greedy rows keep the argmax.
Steps with drafts, trees, or rows past the largest bucket use the eager samplers.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Sequence

import torch

from kernels.sampling import noise_key, sample_static
from splitspec import device as dev
from splitspec.graphs import powers_up_to
from splitspec.params import SamplingParams

log = logging.getLogger(__name__)

_FLOATS = ("temperature", "top_p", "min_p")
_MASK32 = 0xFFFFFFFF
_INTS = ("top_k", "keyed", "key_lo", "key_hi")


class StepSampler:
    """Static buffers for up to `max_rows` rows of a `vocab`-wide step, and a graph per batch
    bucket once captured. `enabled`: whether steps use it (a device that captures; tests run
    its body eagerly)."""

    def __init__(self, device: torch.device, vocab: int, max_rows: int, enabled: bool,
                 counts: Counter | None = None):
        self.device = device
        self.enabled = enabled
        self.buckets = powers_up_to(max(1, max_rows))
        rows = self.buckets[-1]
        self.logits = torch.zeros(rows, vocab, dtype=torch.float32, device=device)
        self.noise = torch.ones(rows, vocab, dtype=torch.float32, device=device)
        self.floats = torch.zeros(len(_FLOATS), rows, dtype=torch.float32, device=device)
        self.ints = torch.zeros(len(_INTS), rows, dtype=torch.int64, device=device)
        self.tokens = torch.zeros(rows, dtype=torch.int64, device=device)
        self._host_f = dev.pinned_empty(self.floats.numel(), torch.float32, device)
        self._host_i = dev.pinned_empty(self.ints.numel(), torch.int64, device)
        self._graphs: dict[int, object] = {}
        # steps sampled here: "captured" (a graph replayed), "eager" (no graph for the bucket)
        self.counts = Counter() if counts is None else counts

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def serves(self, n: int) -> bool:
        return self.enabled and self.bucket(n) is not None

    def body(self, b: int) -> None:
        """What a graph records for bucket b: the first b rows' tokens."""
        f, i = self.floats[:, :b], self.ints[:, :b]
        self.tokens[:b].copy_(sample_static(
            self.logits[:b], f[0], i[0], f[1], f[2], i[1], i[2:4].T, self.noise[:b]))

    def capture(self, pool, stream) -> None:
        """A graph per bucket in the step graphs' pool (start-up); a failed one runs eagerly."""
        device = self.device
        for b in self.buckets:
            try:
                stream.wait_stream(dev.current_stream(device))
                with dev.use_stream(device, stream):
                    for _ in range(2):
                        self.body(b)
                dev.current_stream(device).wait_stream(stream)
                graph = dev.new_graph(device)
                with torch.inference_mode(), dev.capture(device, graph, pool, stream):
                    self.body(b)
                self._graphs[b] = graph
            except Exception:  # noqa: BLE001 - that bucket samples eagerly, logged
                log.exception("capturing the step sampler for %d rows failed: it runs eagerly", b)

    @property
    def captured(self) -> int:
        return len(self._graphs)

    def __call__(self, logits: torch.Tensor, params: Sequence[SamplingParams],
                 positions: Sequence[int]) -> torch.Tensor:
        """Each row's token (int64 [n] on the device, not waited for): logits [n, V] of the
        step's sampled rows, each row's parameters and the position its token takes."""
        n = len(params)
        b = self.bucket(n)
        self.logits[:n].copy_(logits)
        width = self.floats.shape[1]
        hf = self._host_f[:self.floats.numel()].view(len(_FLOATS), width)
        hi = self._host_i[:self.ints.numel()].view(len(_INTS), width)
        f, i = hf.numpy(), hi.numpy()  # the pinned buffers' memory: element writes cost ns
        f[:] = 0.0
        f[1] = 1.0  # padding and greedy rows: temperature 0, no stage
        i[:] = 0
        unseeded = False
        for r, (p, at) in enumerate(zip(params, positions)):
            if p.greedy:
                continue
            f[0, r], f[1, r], f[2, r], i[0, r] = p.temperature, p.top_p, p.min_p, p.top_k
            if p.seed is not None:
                key = noise_key(p.seed, at)
                i[1, r], i[2, r], i[3, r] = 1, key & _MASK32, key >> 32  # as key_halves
            else:
                unseeded = True
        self.floats.copy_(hf, non_blocking=True)
        self.ints.copy_(hi, non_blocking=True)
        if unseeded:  # Exp(1), as draw_exponentials
            self.noise[:b].uniform_().log_().neg_()
        graph = self._graphs.get(b)
        if graph is not None:
            self.counts["captured"] += 1
            graph.replay()
        else:
            self.counts["eager"] += 1
            self.body(b)
        return self.tokens[:n]
