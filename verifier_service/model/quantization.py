"""`--quantization`: the products the target runs with, as the user asked.

`int8` runs every product of the target (each layer's projections and the output head) on int8
weights with one float32 scale per output column (kernels/int8_dot.py, kernels/linear.py's
int8-dot): half the bytes of fp16 weights for a step bound by reading them. The embedding and
the norms stay float32 (a step reads one embedding row per token, not the table). The product is
batch invariant, so speculation is lossless with respect to the quantized model: greedy output
the same with speculation off and on, seeded sampling the same. Its numbers are not the
unquantized model's (bench/reports/quantization.md: speed and perplexity).

It runs where the int8 product does: a CPU with AVX2 and FMA (or AVX-512), float32 activations,
a C++ compiler at first use (or the library built before). Elsewhere start-up is refused with
the reason, before the model loads.
"""

from __future__ import annotations

import torch

from kernels import int8_dot
from kernels.linear import available
from splitspec.errors import StartupError

QUANTIZED = {"int8": "int8-dot"}  # --quantization -> the linear backend it runs


def linear_backend(linear: str, quantization: str, device: torch.device,
                   dtype: torch.dtype) -> str:
    """The --linear backend the target runs with under --quantization (`linear` itself for
    none); StartupError where the quantized product cannot run on this device."""
    if quantization == "none":
        return linear
    if quantization not in QUANTIZED:
        raise StartupError(f"--quantization {quantization!r}: one of none, "
                           f"{', '.join(QUANTIZED)}")
    backend = QUANTIZED[quantization]
    if device.type != "cpu" or dtype != torch.float32:
        raise StartupError(f"--quantization {quantization} runs on a CPU with float32 "
                           f"activations, not on {device.type} with {dtype} (--device cpu, "
                           "--dtype float32 or auto)")
    if not available(backend):
        why = int8_dot.why_unavailable() or "its self-check on this CPU failed"
        raise StartupError(f"--quantization {quantization}: the int8 product cannot run here: "
                           f"{why}")
    return backend
