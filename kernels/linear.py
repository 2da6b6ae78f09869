"""Linear layers whose weights are packed once for the fastest skinny matmul of the device.

A decoding step multiplies a few rows (1 for a plain decode, k + 1 per sequence when verifying)
by every weight matrix of the model, so a step is bound by reading the weights and by how well
the GEMM treats a left operand of a few rows. On x86 CPUs the dense path (F.linear, MKL sgemm)
does neither well: on the 2-core development machine a 6-row product of the target's 512 x 1376
weight costs 4x a 1-row one, and a whole 6-row verify 1.6-1.8x a decode step. Packed once:

  dense   F.linear: every device, the reference.
  onednn  fp32 weights reordered once into oneDNN's blocked layout (CPU, float32). A 6-row
          forward of the target costs 1.2x a 1-row one, and a 1-row one ~0.65x of dense.
  fp16    FBGEMM-packed fp16 weights with fp32 activations and fp32 accumulation (CPU, float32).
          Only for weights that are all exactly fp16 values (a checkpoint stored in fp16 and
          loaded as fp32): the products use the very same numbers and read half the bytes. Its
          micro-kernel takes rows in blocks and treats a remainder with other code, so a row's
          bits depend on the row count; padded with zero rows to a whole number of blocks (the
          block probed once, `fp16_row_block`: 3 on the AMD EPYC development parts) every row of
          every call gets the bits it gets alone. There the target's products for one row cost
          0.3-0.5x oneDNN's (3.6 against 10.7 ms for the toy family's step). It splits a call
          over threads by rows: a decode row runs on one core however many it is given.
  fp16-dot  the same fp16 weights and fp32 arithmetic in this project's own product
          (kernels/fp16_dot.py, compiled at first use where a C++ compiler is found): every
          output one sequential fused multiply-add sum over the inner dimension, columns split
          over torch's threads, a tile of rows sharing each weight chunk from registers. A row's
          bits are the same alone, among any rows, at any thread count, and with AVX-512 or
          AVX2. On the 2-core development machine (AVX-512, 2 threads) the real target's products
          for a decode row take 9.8 ms against fp16's 25.2, 1.13x the time two cores take to
          read its fp16 weights once, and its forward costs 1.15x a decode for 4 rows, 1.40x
          for 10 (bench/reports/forward.md).
  auto    for a model whose rows must not depend on their batch (the target: a verified row
          must see a decode row's numbers): fp16-dot where every weight of the model is
          fp16-exact and it runs here, else fp16, else onednn, on a CPU float32 model; dense on
          accelerators and other dtypes; a packed kernel only where it is batch invariant on this
          CPU (probed once, see below). The fp16 kernels need not give a row the same bits
          (on the development machine they agree for the real target's shapes, not for every
          shape), so one model runs one of them for every row count, never a choice by count;
          fp16-dot is the faster there at every count from 1 to 13 rows anyway.
          auto never quantizes.
  int8-dot  `--quantization int8`, a user's choice: every weight quantized once to int8 with one
          float32 scale per output column (kernels/int8_dot.py: symmetric, max |w| / 127), the
          fp16-dot scheme over half the bytes: fp32 rows, each output one sequential fused
          multiply-add sum of x[k] * q[n, k], times the column's scale. Batch invariant like
          fp16-dot, so speculation stays lossless with respect to the quantized model; its
          numbers are not the fp16 model's (bench/reports/quantization.md: speed and perplexity).
          Drafters (proposers, heads on the target's features) need no such thing: a
          draft only decides how many tokens a step keeps, never which, so for them
          (`invariant=False`) auto takes fp16 wherever the weights allow, the kernel that reads
          the fewest bytes (a drafting step reads every weight for one or a few rows), FBGEMM's
          as before: a drafter's process has its own threads and small weights.

Unlike dense, the packed kernels are batch invariant on the CPUs they were built for: a row's
result does not depend on how many other rows share the call (tests/kernels/test_linear.py), so
a token verified in a 6-row step sees the same numbers as in a 1-row decode. That is a property
of the CPU's code path, not of the library (FBGEMM's fp16 kernel is invariant only padded to
its row block, above). `batch_invariant` probes it once and `auto` skips a kernel that fails;
naming such a kernel explicitly still runs it.
"""

from __future__ import annotations

import functools
import warnings
from typing import Iterable

import torch
import torch.nn.functional as F

from kernels import fp16_dot, int8_dot

BACKENDS = ("auto", "dense", "onednn", "fp16", "fp16-dot", "int8-dot")
FP16 = ("fp16", "fp16-dot")  # the backends that compute with the weights' fp16 values
_BATCH_HINT = 8  # oneDNN picks its blocking for about this many rows; any count is accepted
_ROW_BLOCKS = (1, 2, 3, 4, 6, 8, 12, 14, 16)  # FBGEMM fp16 micro-kernel heights tried


def _pack_fp16(weight: torch.Tensor):
    # torch marks the FBGEMM fp16 entry points deprecated (pinned torch keeps them): say nothing
    for name in ("fbgemm_pack_gemm_matrix_fp16", "fbgemm_linear_fp16_weight_fp32_activation"):
        warnings.filterwarnings("ignore", message=f"{name} is deprecated")
    return torch.fbgemm_pack_gemm_matrix_fp16(weight)


def _fp16_rows(packed, x: torch.Tensor, block: int) -> torch.Tensor:
    """FBGEMM's fp16 product of rows x [M, K], zero rows padding M to a multiple of block."""
    m = x.shape[0]
    pad = -m % block
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    y = torch.fbgemm_linear_fp16_weight_fp32_activation(x, packed, None)
    return y[:m] if pad else y


@functools.lru_cache(maxsize=None)
def fp16_row_block() -> int | None:
    """The row block padding FBGEMM's fp16 product to which makes every row's bits independent
    of the rest of the call on this CPU (its micro-kernel's height), None when no block tried
    does (or the kernel is missing). Probed once on a fixed fp16-exact weight: rows alone
    against the same rows in calls of several sizes and offsets."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return None
    g = torch.Generator().manual_seed(0)
    cases = []
    for out, inner in ((160, 512), (48, 1376)):  # a short and a long reduction
        w = torch.randn(out, inner, generator=g).to(torch.float16).to(torch.float32)
        cases.append((w, torch.randn(40, inner, generator=g)))
    try:
        with torch.inference_mode():
            packed = [(_pack_fp16(w), x) for w, x in cases]
            for block in _ROW_BLOCKS:
                if all(_invariant_padded(p, x, block) for p, x in packed):
                    return block
    except RuntimeError:
        return None
    return None


def _invariant_padded(packed, x: torch.Tensor, block: int) -> bool:
    alone = torch.cat([_fp16_rows(packed, x[i:i + 1], block) for i in range(x.shape[0])])
    return all(torch.equal(_fp16_rows(packed, x[start:start + rows], block),
                           alone[start:start + rows])
               for rows in range(2, 25) for start in (0, 5))


@functools.lru_cache(maxsize=None)
def available(backend: str) -> bool:
    """Whether this build and CPU run the backend (tried once on a tiny weight)."""
    if backend == "dense":
        return True
    if backend not in BACKENDS[1:]:
        return False
    if backend == "fp16" and "fbgemm" not in torch.backends.quantized.supported_engines:
        return False
    if backend == "fp16-dot" and fp16_dot.library() is None:
        return False
    if backend == "int8-dot" and int8_dot.library() is None:
        return False
    if backend == "onednn" and not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.full((4, 8), 127.0)  # exact in every backend: fp16, int8 with scale 1
        return bool(torch.equal(PackedLinear(w, None, backend)(torch.ones(2, 8)),
                                torch.full((2, 4), 1016.0)))
    except RuntimeError:
        return False


@functools.lru_cache(maxsize=None)
def batch_invariant(backend: str) -> bool:
    """Whether the backend gives every row the same bits whatever else shares its call, on this
    CPU (probed once on fixed fp16-exact weights, a short and a long reduction as a model's
    products have, at the row counts a step uses and the current thread count). A long one
    matters: on the AVX-512 development machine oneDNN is invariant over 512 inputs and not
    over 1536 (a 1-row call takes other code)."""
    if not available(backend):
        return False
    if backend == "dense":
        return False  # MKL sgemm picks its blocking by the row count
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for out, inner in ((256, 512), (96, 1536)):
            w = torch.randn(out, inner, generator=g).to(torch.float16).to(torch.float32)
            x = torch.randn(16, inner, generator=g)
            lin = PackedLinear(w, None, backend)
            alone = torch.cat([lin(x[i:i + 1]) for i in range(x.shape[0])])
            if not all(torch.equal(lin(x[:rows]), alone[:rows]) for rows in (2, 5, 8, 13, 16)):
                return False
    return True


def fp16_exact(weight: torch.Tensor) -> bool:
    """Whether every value of a float32 weight is exactly an fp16 value."""
    return bool(torch.equal(weight.to(torch.float16).to(weight.dtype), weight))


def resolve(backend: str, weights: Iterable[torch.Tensor], invariant: bool = True) -> str:
    """The backend a model runs with: `backend` itself if it is not auto; for auto, see the
    module docstring (invariant: whether a row's result must not depend on its batch). A packed
    backend that cannot run here raises ValueError."""
    if backend not in BACKENDS:
        raise ValueError(f"linear backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    weights = list(weights)
    cpu_fp32 = all(w.device.type == "cpu" and w.dtype == torch.float32 for w in weights)
    if backend == "auto":
        if not cpu_fp32:
            return "dense"
        exact = all(fp16_exact(w) for w in weights)
        if exact and invariant and batch_invariant("fp16-dot"):
            return "fp16-dot"
        fp16_ok = batch_invariant("fp16") if invariant else available("fp16")
        if fp16_ok and exact:
            return "fp16"
        onednn_ok = batch_invariant("onednn") if invariant else available("onednn")
        return "onednn" if onednn_ok else "dense"
    if backend != "dense" and not (cpu_fp32 and available(backend)):
        raise ValueError(f"linear backend {backend!r} needs float32 weights on a CPU that has it")
    return backend


class PackedLinear:
    """y = x @ weight.T + bias, with the weight packed once for `backend` (see resolve).
    invariant: whether each row must get the bits it gets alone (the target's products); fp16
    pads the rows to its probed block for that, two more operators per product that a drafter,
    which needs no such thing, skips."""

    __slots__ = ("backend", "weight", "bias", "_packed", "_block", "_scale")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, backend: str,
                 invariant: bool = True):
        if backend not in BACKENDS[1:]:
            raise ValueError(f"unknown linear backend {backend!r}")
        if backend in FP16 and not fp16_exact(weight):
            raise ValueError("fp16 packing needs weights that are exactly fp16 values")
        self.backend = backend
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self._block = (fp16_row_block() or 1) if backend == "fp16" and invariant else 1
        self._scale = None
        with torch.inference_mode():
            if backend == "onednn":
                self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, _BATCH_HINT)
            elif backend == "fp16":
                self._packed = _pack_fp16(self.weight)
            elif backend == "fp16-dot":
                self._packed = fp16_dot.pack(self.weight)
            elif backend == "int8-dot":
                q, self._scale = int8_dot.quantize(self.weight)
                self._packed = int8_dot.pack(q)
            else:
                self._packed = self.weight

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def release_weight(self) -> None:
        """Let go of the weight a packed product no longer reads (its packed copy computes):
        `weight` becomes a meta tensor of the same shape and dtype, so its shape still answers
        and a read of its values fails loudly. Dense products compute with it: kept."""
        if self.backend != "dense":
            self.weight = torch.empty(self.weight.shape, dtype=self.weight.dtype, device="meta")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "dense":
            return F.linear(x, self.weight, self.bias)
        rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # rows as they come: no op
        if self.backend == "onednn":
            y = torch.ops.mkldnn._linear_pointwise(rows, self._packed, self.bias, "none", [], "")
        elif self.backend == "fp16-dot":
            y = fp16_dot.product(rows, self._packed, self.weight.shape[0], self.bias)
        elif self.backend == "int8-dot":
            y = int8_dot.product(rows, self._packed, self._scale, self.bias)
        else:
            y = _fp16_rows(self._packed, rows, self._block)
            if self.bias is not None:
                y = y + self.bias
        return y if x.dim() == 2 else y.view(*x.shape[:-1], y.shape[-1])


class _PackedModule(torch.nn.Module):
    """An nn.Linear stand-in running a PackedLinear (weight and bias stay readable)."""

    def __init__(self, packed: PackedLinear):
        super().__init__()
        self.packed = packed
        self.in_features = packed.weight.shape[1]
        self.out_features = packed.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.packed.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.packed.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.packed(x)


def pack_linears(module: torch.nn.Module, backend: str, invariant: bool = True) -> str:
    """Replace every nn.Linear inside `module` (for inference) by one running on `backend`,
    resolved over all their weights (see resolve), in place; returns the backend chosen
    (dense: untouched)."""
    linears = [(name, m) for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)]
    chosen = resolve(backend, [m.weight for _, m in linears], invariant)
    if chosen == "dense":
        return chosen
    for name, m in linears:
        parent, _, attr = name.rpartition(".")
        owner = module.get_submodule(parent) if parent else module
        setattr(owner, attr, _PackedModule(PackedLinear(m.weight, m.bias, chosen, invariant)))
    return chosen
