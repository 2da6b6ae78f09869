"""tests/polling.py: the wait returns the predicate's first truthy value, and a wait that times
out fails with what it waited for and the last value seen instead of hanging."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from polling import wait_until, wait_until_async


def test_returns_the_first_truthy_value():
    values = iter([None, [], 0, ["ready"], ["later"]])
    assert wait_until(lambda: next(values), 5, 0) == ["ready"]


def test_a_timeout_names_what_was_awaited_and_the_last_value():
    calls = itertools.count()
    with pytest.raises(AssertionError, match=r"waiting for the queue to drain \(last value: 0\)"):
        wait_until(lambda: next(calls) and 0, 0.05, 0.01, "the queue to drain")
    assert next(calls) > 1  # it polled more than once before giving up


def test_a_message_function_is_called_at_timeout():
    state = {"n": 0}

    def never() -> bool:
        state["n"] += 1
        return False

    with pytest.raises(AssertionError, match=r"waiting for n > 0 after [1-9]\d* polls"):
        wait_until(never, 0.02, 0.005, lambda: f"n > 0 after {state['n']} polls")


def test_the_predicates_own_failure_ends_the_wait_at_once():
    def dead() -> bool:
        raise AssertionError("the service exited")

    with pytest.raises(AssertionError, match="the service exited"):
        wait_until(dead, 60)


def test_the_async_wait_lets_other_tasks_run_between_polls():
    async def scenario():
        done: list[str] = []

        async def worker():
            await asyncio.sleep(0.01)
            done.append("work")

        task = asyncio.create_task(worker())
        got = await wait_until_async(lambda: done, 5)
        await task
        with pytest.raises(AssertionError, match="waiting for nothing"):
            await wait_until_async(lambda: None, 0.02, message="nothing")
        return got

    assert asyncio.run(scenario()) == ["work"]
