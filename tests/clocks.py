"""Clocks a test moves by hand, so that a timeout in the code under test passes without the test
sleeping through it.

`FakeClock` stands in for the `time` module of code that reads `time.monotonic()` (patch the
module's `time` with it). `ManualClockLoop` is a real asyncio event loop whose clock runs ahead
when told: timers set with `call_later` fire on `advance`, at once.
"""

from __future__ import annotations

import asyncio


class FakeClock:
    """time.monotonic() that moves only when the test advances it."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ManualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose time() is the real one plus what the test advanced it by."""

    def __init__(self):
        super().__init__()
        self._ahead = 0.0

    def time(self) -> float:
        return super().time() + self._ahead

    def advance(self, seconds: float) -> None:
        """Move the clock on and run the loop once: every timer now due runs."""
        self._ahead += seconds
        # the first turn runs the timers that fell due (after the task's own step), the
        # second finishes the task
        self.run_until_complete(asyncio.sleep(0))
