"""What a captured graph's body may not do, checked on the CPU by a dispatch mode over every
operator the body runs (a graph records device work only; the host's part happens once, at
capture):

  * hand a tensor's value to the host (.item(), int(t), bool(t)) or make a shape depend on
    values (nonzero, masked_select, unique): on a device each is a blocking sync, and inside
    a capture an error;
  * copy a host value in: a tensor made of a Python list (`torch.tensor([1, 2])`), or a Python
    scalar written through advanced indexing (`t[rows, cols] = True`: index_put_ moves the
    value, built on the host, to the device; a blocking copy from pageable memory, which a
    capture refuses with "Cannot copy between CPU and CUDA tensors during CUDA graph
    capture"). A scalar written through basic indexing (`t[:, 0] = False`) is a fill on the
    device and allowed.

The CPU shows a host value only as the operator that lifts it (`lift_fresh`): the mode
remembers what was lifted and refuses it where a device would copy it.
"""

from __future__ import annotations

import weakref

from torch.utils._python_dispatch import TorchDispatchMode

HOST_READS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "item")
COPIES_VALUES_IN = ("index_put",)


class GraphSafe(TorchDispatchMode):
    """Fails on the first operator a captured body may not run, naming it."""

    def __init__(self) -> None:
        super().__init__()
        self._lifted: weakref.WeakSet = weakref.WeakSet()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if any(name.startswith(f) for f in HOST_READS):
            raise AssertionError(f"host read inside a captured body: {func}")
        if name.startswith(COPIES_VALUES_IN) and any(
                a in self._lifted for a in args if hasattr(a, "dim")):
            raise AssertionError(f"a host value copied in inside a captured body: {func}")
        out = func(*args, **(kwargs or {}))
        if name.startswith("lift_fresh"):
            if out.dim() > 0:
                raise AssertionError(f"a host array copied in inside a captured body: {func}")
            self._lifted.add(out)
        return out
