"""Whether Triton can be used, decided lazily at call time (importing kernels never imports
triton)."""

from __future__ import annotations

import functools
import importlib.util


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when the `triton` package (upstream, or Cambricon's build for MLU) is importable."""
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        import triton  # noqa: F401
    except Exception:  # a broken install counts as absent: the reference path still works
        return False
    return True
