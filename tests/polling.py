"""Waiting in tests for what happens on another thread, process or task: poll a predicate until
it holds, with a deadline, instead of sleeping a fixed time or looping unbounded.

`wait_until` (threads and processes) and `wait_until_async` (on an event loop, which keeps
running the code under test between polls) return the predicate's first truthy value, so a
test can wait for a thing and use it in one line. On timeout they raise AssertionError saying
what was awaited and the last value seen; an exception raised by the predicate (an assert that
the service is still alive, say) ends the wait at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
# What is awaited, as the failure message ends "waiting for <message>"; a callable is called
# at timeout, to show the state then.
Message = str | Callable[[], str]


def wait_until(predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.05,
               message: Message = "the condition") -> T:
    """Call predicate() every interval_s seconds until it returns a truthy value, and return
    that value; AssertionError once timeout_s seconds have passed without one."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        _check(deadline, timeout_s, message, value)
        time.sleep(interval_s)
    return value


async def wait_until_async(predicate: Callable[[], T], timeout_s: float,
                           interval_s: float = 0.005, message: Message = "the condition") -> T:
    """wait_until on the running event loop: sleeps with asyncio, so tasks keep running."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        _check(deadline, timeout_s, message, value)
        await asyncio.sleep(interval_s)
    return value


def _check(deadline: float, timeout_s: float, message: Message, last) -> None:
    if time.monotonic() >= deadline:
        what = message() if callable(message) else message
        raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} "
                             f"(last value: {last!r})")
