"""Builds the project's C++ kernels (kernels/csrc/*.cpp) into shared libraries at first use.

A library is compiled with the C++ compiler found at run time ($CXX, else g++ or c++; about a
second) against the installed torch, with OpenMP as torch's own, so that at::parallel_for runs
on torch's thread pool and obeys torch.set_num_threads. It is cached under
$SPLITSPEC_KERNEL_CACHE (default ~/.cache/splitspec/kernels) by a hash of the source, the flags
and the torch version, written whole and renamed into place (processes building at once never
load half a file). A library found there loads without a compiler: the CPU image builds every
library at image build time (`python -m kernels.cpp_build`, the Dockerfile's build-cpu stage)
and serves without one. Where no x86-64 Linux machine is found, or neither a built library nor
a compiler, or the build fails, `load` returns None and the reason.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent / "csrc"


def cache_dir() -> Path:
    configured = os.environ.get("SPLITSPEC_KERNEL_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "splitspec" / "kernels"


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build(cxx: str, source: Path, flags: tuple[str, ...], out: Path) -> None:
    torch_dir = Path(torch.__file__).resolve().parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        # OpenMP as torch's own (torch/lib/libgomp first on the run path)
        cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fopenmp", *flags,
               f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{torch_dir / 'include'}", str(source),
               "-o", tmp, f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu",
               f"-Wl,-rpath,{torch_dir / 'lib'}"]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


LIBRARIES = {"fp16_dot": (), "int8_dot": ("-ffp-contract=off",),
             "cpu_step": ("-ffp-contract=off",)}  # stem -> its extra flags


def library_path(stem: str, flags: tuple[str, ...]) -> Path:
    source = CSRC / f"{stem}.cpp"
    key = hashlib.sha256(source.read_bytes() + " ".join(flags).encode()
                         + torch.__version__.encode()).hexdigest()[:16]
    return cache_dir() / f"{stem}-{key}.so"


def load(stem: str, find_compiler=compiler) -> tuple[ctypes.CDLL | None, str | None]:
    """kernels/csrc/<stem>.cpp built (or found built) and loaded: (library, None), or (None,
    why not)."""
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "AMD64"):
        return None, "an x86-64 Linux machine is needed"
    flags = LIBRARIES[stem]
    path = library_path(stem, flags)
    try:
        if not path.exists():
            cxx = find_compiler()
            if cxx is None:
                return None, "no C++ compiler ($CXX, g++ or c++) and no library built before"
            _build(cxx, CSRC / f"{stem}.cpp", flags, path)
        return ctypes.CDLL(str(path)), None
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        return None, f"the build failed: {detail.strip()[-500:]}"


def main() -> None:
    """Build every library into the cache (an image's build step); fails if one does not."""
    for stem in LIBRARIES:
        lib, reason = load(stem)
        if lib is None:
            raise SystemExit(f"{stem}: {reason}")
        print(library_path(stem, LIBRARIES[stem]))


if __name__ == "__main__":
    main()
