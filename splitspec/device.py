"""The one place that knows about devices: cpu, cuda, or mlu (Cambricon, via torch_mlu).

Chosen at run time (`--device auto` picks the first accelerator present); nothing imports a
vendor extension at import time.
"""

from __future__ import annotations

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
        return torch.device(name)
    except RuntimeError as exc:
        raise BadOption(f"--device {name!r}: {exc}") from None


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` -> float32 on cpu (no bf16 hardware assumed), bfloat16 on accelerators."""
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    try:
        return DTYPES[name]
    except KeyError:
        raise BadOption(f"--dtype: unknown dtype {name!r}; choose from {sorted(DTYPES)}"
                        ) from None


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


def memory_stats(device: torch.device) -> dict[str, int]:
    if device.type == "cuda":
        return {"allocated_bytes": torch.cuda.memory_allocated(device),
                "reserved_bytes": torch.cuda.memory_reserved(device)}
    if device.type == "mlu":
        return {"allocated_bytes": torch.mlu.memory_allocated(device),
                "reserved_bytes": torch.mlu.memory_reserved(device)}
    return {}
