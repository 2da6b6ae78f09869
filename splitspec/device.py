"""The one place that knows about devices: cpu, cuda, or mlu (Cambricon, via torch_mlu).

Chosen at run time (`--device auto` picks the first accelerator present); nothing imports a
vendor extension at import time.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util

import torch

from splitspec.errors import BadOption, DeviceUnavailable

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def _mlu_available() -> bool:
    if importlib.util.find_spec("torch_mlu") is None:
        return False
    importlib.import_module("torch_mlu")  # registers the "mlu" device with torch
    return bool(getattr(torch, "mlu", None)) and torch.mlu.is_available()


def resolve_device(name: str = "auto") -> torch.device:
    """`auto` -> mlu, else cuda, else cpu. An explicit name that is not present is an error."""
    if name == "auto":
        if _mlu_available():
            return torch.device("mlu")
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    if name.startswith("mlu") and not _mlu_available():
        raise DeviceUnavailable("--device mlu asked for, but torch_mlu is not installed or "
                                "sees no MLU")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceUnavailable("--device cuda asked for, but torch sees no CUDA device")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise BadOption(f"--device {name!r}: {exc}") from None
    if device.type == "cuda":
        shape_stable_attention()
    return device


def shape_stable_attention() -> None:
    """Take cuDNN out of scaled_dot_product_attention's backends (process-wide). torch sends
    a masked SDPA to cuDNN first on recent GPUs, and cuDNN builds an execution plan for every
    new shape: tens to hundreds of milliseconds each. Serving changes shapes every step (a
    prefill's length, an EAGLE head's or an eager draft's growing keys), so each new length
    paid that: on an H100 the first pass of EAGLE ran at 0.01-0.08x speculation off and its
    repeats (same lengths, plans cached) at 0.2-0.4x. Flash and memory-efficient attention
    serve these shapes with nothing to build."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` -> float32 on cpu (no bf16 hardware assumed), bfloat16 on accelerators."""
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    try:
        return DTYPES[name]
    except KeyError:
        raise BadOption(f"--dtype: unknown dtype {name!r}; choose from {sorted(DTYPES)}"
                        ) from None


def rank_device(device: torch.device, local_rank: int) -> torch.device:
    """The device of one tensor-parallel rank on this host: accelerator `local_rank` (one
    process per device), or the CPU for every rank."""
    if device.type in ("cuda", "mlu"):
        return torch.device(device.type, local_rank)
    return device


# torch.distributed's backend for the collectives of a device's tensors: NCCL on CUDA,
# Cambricon's CNCL (registered by torch_mlu) on an MLU, gloo on the CPU
_COLLECTIVES = {"cuda": "nccl", "mlu": "cncl", "cpu": "gloo"}


def collective_backend(device: torch.device) -> str:
    try:
        return _COLLECTIVES[device.type]
    except KeyError:
        raise BadOption(f"no collective backend for device {device}") from None


def set_current(device: torch.device) -> None:
    """Make `device` this process's current accelerator (collectives and graphs use it)."""
    if device.type in ("cuda", "mlu") and device.index is not None:
        _backend(device).set_device(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mlu":
        torch.mlu.synchronize(device)


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A per-request generator on the device where that request's random numbers are drawn."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def memory_info(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of an accelerator's memory as the driver reports them (others'
    allocations included); (0, 0) on the CPU, whose memory --gpu-memory-utilization does not
    size."""
    if device.type in ("cuda", "mlu"):
        free, total = _backend(device).mem_get_info(device)
        return int(free), int(total)
    return 0, 0


def memory_allocated(device: torch.device) -> int:
    """Bytes this process's tensors hold on an accelerator (0 on the CPU)."""
    if device.type in ("cuda", "mlu"):
        return int(_backend(device).memory_allocated(device))
    return 0


def memory_stats(device: torch.device) -> dict[str, int]:
    if device.type == "cuda":
        return {"allocated_bytes": torch.cuda.memory_allocated(device),
                "reserved_bytes": torch.cuda.memory_reserved(device)}
    if device.type == "mlu":
        return {"allocated_bytes": torch.mlu.memory_allocated(device),
                "reserved_bytes": torch.mlu.memory_reserved(device)}
    return {}


# -- graphs, streams, events, pinned memory: what a step executor needs of a device ------------
#
# CUDA has all of it in torch.cuda. Cambricon's torch_mlu mirrors the same names under torch.mlu
# (MLUGraph, graph, graph_pool_handle, Stream, Event, stream): that is the whole seam an MLU
# needs; a device without graphs runs the same step body eagerly.

_GRAPH_CLASS = {"cuda": "CUDAGraph", "mlu": "MLUGraph"}


def _backend(device: torch.device):
    return getattr(torch, device.type)


def trim_host_heap() -> None:
    """Give the host heap's free pages back to the OS (glibc's malloc_trim; nothing elsewhere).
    Loading weights leaves its temporaries (file buffers, dtype conversions) and the copies a
    packed model let go of free inside the heap but counted in the process's RSS: on the real
    model on a CPU 370 MiB of the first and 400 MiB of the second."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def supports_graphs(device: torch.device) -> bool:
    """Whether steps can be captured as graphs and replayed on this device."""
    name = _GRAPH_CLASS.get(device.type)
    return name is not None and hasattr(_backend(device), name)


def new_graph(device: torch.device):
    return getattr(_backend(device), _GRAPH_CLASS[device.type])()


def graph_pool(device: torch.device):
    """A memory pool handle every graph of one executor shares (one replays at a time)."""
    return _backend(device).graph_pool_handle()


def capture(device: torch.device, graph, pool, stream):
    """Context manager: the work launched inside is recorded into `graph`, not run."""
    return _backend(device).graph(graph, pool=pool, stream=stream)


def new_stream(device: torch.device):
    return _backend(device).Stream(device=device)


def use_stream(device: torch.device, stream):
    return _backend(device).stream(stream)


def current_stream(device: torch.device):
    return _backend(device).current_stream(device)


def new_event(device: torch.device):
    return _backend(device).Event()


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without the host waiting for the device's queue (a blocking
    copy would); the tensor itself on the CPU."""
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def pinned_empty(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host buffer the device copies from or into without a staging copy (pinned where the
    device is an accelerator)."""
    return torch.empty(n, dtype=dtype, pin_memory=device.type in _GRAPH_CLASS)


class HostFetch:
    """Device tensors to the host in one copy and one wait: int tensors (token ids, counts,
    indices: int32 on the way) and float32 tensors packed into one int32 buffer, copied into
    pinned memory without blocking, then one event wait. On the CPU the tensors are the host's
    already: nothing is copied."""

    def __init__(self, device: torch.device):
        self.device = device
        self._event = new_event(device) if device.type in _GRAPH_CLASS else None
        self._host = pinned_empty(1 << 12, torch.int32, device)

    def __call__(self, ints=(), floats=()):
        """-> (int64 numpy arrays of `ints`, float32 numpy arrays of `floats`)."""
        if self._event is None:
            return ([_as(t, torch.int64).numpy() for t in ints],
                    [_as(t, torch.float32).numpy() for t in floats])
        parts = [t.to(torch.int32).reshape(-1) for t in ints]
        parts += [t.to(torch.float32).reshape(-1).view(torch.int32) for t in floats]
        packed = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int32,
                                                             device=self.device)
        n = packed.numel()
        if self._host.numel() < n:
            self._host = pinned_empty(2 * n, torch.int32, self.device)
        host = self._host[:n]
        host.copy_(packed, non_blocking=True)
        self._event.record()
        self._event.synchronize()  # the one wait
        flat = host.numpy()
        out_i, out_f, at = [], [], 0
        for t in ints:
            out_i.append(flat[at:at + t.numel()].astype("int64").reshape(t.shape))
            at += t.numel()
        for t in floats:
            out_f.append(flat[at:at + t.numel()].view("float32").reshape(t.shape).copy())
            at += t.numel()
        return out_i, out_f


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)
