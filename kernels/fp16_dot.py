"""The fp16-dot product (kernels/csrc/fp16_dot.cpp): fp32 rows times weights stored as fp16, each
output one dot product computed the same way whatever shares the call, columns split over torch's
threads.

FBGEMM's fp16 GEMM, the library path, splits a call over threads by rows: a decode row runs on
one core however many it is given, and its micro-kernel's rows cost almost linearly up to its
height. This product splits by output columns instead, so a single row reads the weights with
every thread, and it keeps a tile of rows in registers against each weight chunk, so a few rows
cost little more than one. A row's result is bit-identical alone, among any number of rows and
at any thread count (the C++ file says why).

The library is compiled on first use with the C++ compiler found at run time ($CXX, else g++ or
c++; about a second) against the installed torch, cached under $SPLITSPEC_KERNEL_CACHE (default
~/.cache/splitspec/kernels) by a hash of the source, the torch version and the compiler. Where
there is no compiler, no x86 CPU with AVX2 + FMA + F16C, or the build fails, `library()` is
None, `why_unavailable()` says why, and kernels/linear.py's auto never picks it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent / "csrc" / "fp16_dot.cpp"
_reason: list[str] = []  # why the library did not load, once tried


def _cache_dir() -> Path:
    configured = os.environ.get("SPLITSPEC_KERNEL_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "splitspec" / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build(cxx: str, out: Path) -> None:
    """Compile SOURCE into the shared library `out` (written whole, then renamed into place, so
    processes building at once never load half a file)."""
    torch_dir = Path(torch.__file__).resolve().parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        # OpenMP as torch's own (torch/lib/libgomp first on the run path): at::parallel_for runs
        # on torch's thread pool and obeys torch.set_num_threads
        cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fopenmp",
               f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{torch_dir / 'include'}", str(SOURCE),
               "-o", tmp, f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu",
               f"-Wl,-rpath,{torch_dir / 'lib'}"]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """The compiled product, built on first use (see the module docstring); None where it cannot
    run on this machine."""
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "AMD64"):
        return _unavailable("an x86-64 Linux machine is needed")
    cxx = _compiler()
    if cxx is None:
        return _unavailable("no C++ compiler ($CXX, g++ or c++)")
    key = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode() + cxx.encode()
                         ).hexdigest()[:16]
    path = _cache_dir() / f"fp16_dot-{key}.so"
    try:
        if not path.exists():
            _build(cxx, path)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        return _unavailable(f"the build failed: {detail.strip()[-500:]}")
    for name in ("splitspec_fp16_dot", "splitspec_fp16_dot_avx2"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                       ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_int64]
    if lib.splitspec_fp16_dot_isa() == 0:
        return _unavailable("the CPU has neither AVX-512 nor AVX2 with FMA and F16C")
    return lib


def _unavailable(reason: str) -> None:
    _reason.append(reason)
    log.info("fp16-dot linear kernel unavailable: %s", reason)
    return None


def why_unavailable() -> str | None:
    """Why library() is None (None when it loads)."""
    return None if library() is not None else _reason[-1]


def isa() -> int:
    """The vector width the product runs with here: 512 (AVX-512), 256 (AVX2), 0 (no library)."""
    lib = library()
    return lib.splitspec_fp16_dot_isa() if lib is not None else 0


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A weight [N, K] whose values are fp16 values, in the product's layout: panels of the
    library's panel width of columns, each [K, panel] row-major, zero-padded; int16."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"fp16-dot kernel unavailable: {why_unavailable()}")
    panel = lib.splitspec_fp16_dot_panel()
    n, k = weight.shape
    padded = weight.new_zeros(-(-n // panel) * panel, k, dtype=torch.float16)
    padded[:n] = weight
    return padded.view(-1, panel, k).transpose(1, 2).contiguous().view(torch.int16)


def product(x: torch.Tensor, packed: torch.Tensor, out_features: int,
            bias: torch.Tensor | None = None, avx2: bool = False) -> torch.Tensor:
    """x [M, K] float32 @ weight.T (+ bias) with the weight as pack() left it: [M, N] float32.
    avx2: run the AVX2 code on one thread even where AVX-512 runs (the test that both give the
    same bits)."""
    if x.dtype != torch.float32 or packed.dtype != torch.int16:
        raise TypeError("fp16-dot multiplies float32 rows by weights pack() made")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    m, k = x.shape
    panels, inner, width = packed.shape if packed.dim() == 3 else (0, -1, 0)
    if inner != k or panels * width < out_features:
        raise ValueError(f"fp16-dot weights {tuple(packed.shape)} do not take rows of {k} "
                         f"to {out_features} outputs")
    y = torch.empty(m, out_features, dtype=torch.float32)
    if m:
        lib = library()
        fn = lib.splitspec_fp16_dot_avx2 if avx2 else lib.splitspec_fp16_dot
        fn(x.data_ptr(), m, k, x.stride(0), packed.data_ptr(), out_features,
           None if bias is None else bias.data_ptr(), y.data_ptr(), out_features)
    return y
