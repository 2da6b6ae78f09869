"""What a captured graph's body may not do, checked on the CPU by a dispatch mode over every
operator the body runs (a graph records device work only; the host's part happens once, at
capture):

  * hand a tensor's value to the host (.item(), int(t), bool(t), .tolist(), .numpy()) or make
    a shape depend on values (nonzero, masked_select, unique, indexing by a boolean mask): on a
    device each is a blocking sync, and inside a capture an error;
  * copy a host value in: a tensor made of a Python list (`torch.tensor([1, 2])`), or a Python
    scalar written through advanced indexing (`t[rows, cols] = True`: index_put_ moves the
    value, built on the host, to the device; a blocking copy from pageable memory, which a
    capture refuses with "Cannot copy between CPU and CUDA tensors during CUDA graph
    capture"). A scalar written through basic indexing (`t[:, 0] = False`) is a fill on the
    device and allowed.

The CPU shows a host value only as the operator that lifts it (`lift_fresh`): the mode
remembers what was lifted and refuses it where a device would copy it. `.tolist()` and
`.numpy()` read a CPU tensor's memory without any operator, so they are refused one level up,
where torch hands Python calls on tensors to a function mode.
"""

from __future__ import annotations

import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

HOST_READS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "item")
COPIES_VALUES_IN = ("index_put",)
INDEXES = ("index", "index_put")  # by a boolean mask: a shape (or a write) made of values
# tensor methods that copy values to the host without running an operator
METHOD_READS = ("tolist", "numpy")


def _bool_mask(indices) -> bool:
    return any(getattr(i, "dtype", None) in (torch.bool, torch.uint8) for i in indices or ())


class GraphSafe:
    """Fails on the first operator (or tensor method) a captured body may not run, naming it:
    `with GraphSafe(): body()`."""

    def __init__(self) -> None:
        self._modes = (_NoMethodReads(), _DeviceOnly())

    def __enter__(self) -> "GraphSafe":
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class _NoMethodReads(TorchFunctionMode):
    """Tensor methods that read values without an operator."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in METHOD_READS:
            raise AssertionError(f"host read inside a captured body: Tensor.{func.__name__}")
        return func(*args, **(kwargs or {}))


class _DeviceOnly(TorchDispatchMode):
    """The operators: host reads, value-made shapes, host values copied in."""

    def __init__(self) -> None:
        super().__init__()
        self._lifted: weakref.WeakSet = weakref.WeakSet()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if any(name.startswith(f) for f in HOST_READS):
            raise AssertionError(f"host read inside a captured body: {func}")
        if name.rstrip("_") in INDEXES and len(args) > 1 and _bool_mask(args[1]):
            raise AssertionError(f"host read inside a captured body: {func} by a boolean mask "
                                 "(its shape is the mask's count)")
        if name.startswith(COPIES_VALUES_IN) and any(
                a in self._lifted for a in args if hasattr(a, "dim")):
            raise AssertionError(f"a host value copied in inside a captured body: {func}")
        out = func(*args, **(kwargs or {}))
        if name.startswith("lift_fresh"):
            if out.dim() > 0:
                raise AssertionError(f"a host array copied in inside a captured body: {func}")
            self._lifted.add(out)
        return out
