"""A function of fixed-shape device tensors, captured once per shape as a device graph and
replayed (the proposers' heads and loops; the verifier's step has its own executor).

    replay = Replay(device)                  # captures only where the device has graphs
    replay.capture(key, fn, inputs)          # inputs: name -> static tensor of the shape
    out = replay(key, fn, values)            # values copied into the inputs, graph replayed

fn(inputs) -> a tensor or a tuple of tensors, computed from the inputs alone with no read back
to the host. A replay returns the graph's own output tensors: read them before the next
replay of that key. Where there is no graph for the key (no capture, or it failed: logged)
fn runs eagerly on the values themselves.

Work that a device able to capture runs eagerly all the same is counted by reason and logged
once per reason and shape (`EagerFallbacks`), never silent.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch

from splitspec import device as dev

log = logging.getLogger(__name__)


def powers_up_to(top: int) -> tuple[int, ...]:
    """A ladder of graph shapes: 1, 2, 4 ... below `top`, then `top` itself (always served)."""
    out, n = [], 1
    while n < top:
        out.append(n)
        n *= 2
    return (*out, top)


class EagerFallbacks:
    """What a device that captures graphs ran eagerly all the same: `counts` by reason (what a
    metrics exporter reads) and a warning once per reason and shape."""

    def __init__(self, what: str, counts: Counter | None = None):
        """counts: a Counter kept elsewhere (a stats object's) to count into."""
        self.what = what
        self.counts: Counter = Counter() if counts is None else counts
        self._logged: set = set()

    def record(self, reason: str, **shape) -> None:
        self.counts[reason] += 1
        key = (reason, tuple(shape.items()))
        if key not in self._logged:
            self._logged.add(key)
            log.warning("%s ran eagerly (%s): %s", self.what, reason,
                        ", ".join(f"{name} {value}" for name, value in shape.items()))


class Replay:
    def __init__(self, device: torch.device):
        self.device = device
        self.enabled = dev.supports_graphs(device)
        self._graphs: dict = {}  # key -> (graph, inputs, outputs)
        self._pool = None

    def __contains__(self, key) -> bool:
        return key in self._graphs

    def capture(self, key, fn, inputs: dict[str, torch.Tensor]) -> bool:
        """Record fn over `inputs` (static from now on) for `key`, after two eager runs that
        settle lazy setup. False (logged) when the device has no graphs or capture fails."""
        if not self.enabled:
            return False
        device = self.device
        if self._pool is None:
            self._pool = dev.graph_pool(device)
        stream = dev.new_stream(device)
        try:
            stream.wait_stream(dev.current_stream(device))
            with torch.inference_mode(), dev.use_stream(device, stream):
                for _ in range(2):
                    fn(inputs)
            dev.current_stream(device).wait_stream(stream)
            graph = dev.new_graph(device)
            with torch.inference_mode(), dev.capture(device, graph, self._pool, stream):
                out = fn(inputs)
        except Exception:  # noqa: BLE001 - that shape runs eagerly, logged
            log.exception("capturing %r failed: it runs eagerly", key)
            return False
        self._graphs[key] = (graph, inputs, out)
        return True

    def __call__(self, key, fn, values: dict[str, torch.Tensor]):
        found = self._graphs.get(key)
        if found is None:
            return fn(values)
        graph, inputs, out = found
        for name, value in values.items():
            inputs[name].copy_(value, non_blocking=True)
        graph.replay()
        return out
