"""transport.tasks: owned background tasks and periodic loops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from transport.tasks import Tasks, every


async def until(condition: Callable[[], bool], within_s: float = 5.0) -> None:
    for _ in range(int(within_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within the time")


async def test_spawned_tasks_are_kept_until_they_end_and_stop_ends_the_rest() -> None:
    tasks = Tasks()
    quick = tasks.spawn(asyncio.sleep(0, result=7), name="quick")
    slow = tasks.spawn(asyncio.sleep(60), name="slow")
    assert len(tasks) == 2
    assert await quick == 7
    await asyncio.sleep(0)
    assert list(tasks) == [slow]
    await tasks.stop()
    assert slow.cancelled() and len(tasks) == 0
    await tasks.stop()  # nothing left: returns at once
    again = tasks.spawn(asyncio.sleep(60))  # a stopped group can be used again
    await tasks.stop()
    assert again.cancelled()


async def test_stop_cancels_again_a_task_that_swallowed_its_cancel() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                swallowed += 1  # as Python 3.11 does when the cancel lands as a timeout expires
                if swallowed == 2:
                    raise

    tasks = Tasks()
    task = tasks.spawn(stubborn())
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await tasks.stop()
    assert task.done() and swallowed == 2


async def test_stop_ends_tasks_spawned_while_stopping() -> None:
    tasks = Tasks()
    late: list[asyncio.Task[None]] = []

    async def spawns_on_cancel() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            late.append(tasks.spawn(asyncio.sleep(60)))

    tasks.spawn(spawns_on_cancel())
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await tasks.stop()
    assert late and late[0].cancelled() and len(tasks) == 0


async def test_a_failed_task_is_logged_once_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    tasks = Tasks()
    task = tasks.spawn(fails(), name="doomed")
    with caplog.at_level(logging.ERROR):
        await asyncio.wait({task})
        await asyncio.sleep(0)
    assert len(tasks) == 0
    assert any("doomed failed" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_every_calls_on_each_interval_and_survives_exceptions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0

    async def check() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("a bad round")

    tasks = Tasks()
    with caplog.at_level(logging.ERROR):
        tasks.spawn(every(0.01, check, "the check"))
        await until(lambda: calls >= 4)
        await tasks.stop()
    assert [r.getMessage() for r in caplog.records] == ["the check failed"]


async def test_every_waits_an_interval_first_unless_now() -> None:
    later: list[int] = []
    first: list[int] = []
    tasks = Tasks()
    tasks.spawn(every(60, lambda: later.append(1), "later"))  # a sync fn
    tasks.spawn(every(60, lambda: first.append(1), "first", now=True))
    await asyncio.sleep(0.05)
    await tasks.stop()
    assert (later, first) == ([], [1])


async def test_an_interval_asked_of_a_function_is_asked_again_at_each_wait() -> None:
    interval = [0.01]
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1

    tasks = Tasks()
    tasks.spawn(every(lambda: interval[0], call, "paced"))
    await until(lambda: calls >= 3)
    interval[0] = 60.0  # the next wait is the new one
    await asyncio.sleep(0.05)
    seen = calls
    await asyncio.sleep(0.1)
    await tasks.stop()
    assert calls == seen, "no call within the new interval"


async def test_wake_calls_at_once_and_again_if_woken_during_the_call() -> None:
    wake = asyncio.Event()
    calls = 0
    running = asyncio.Event()
    release = asyncio.Event()

    async def fn() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            running.set()
            await release.wait()

    tasks = Tasks()
    tasks.spawn(every(None, fn, "woken only", wake=wake))  # no interval: only when woken
    await asyncio.sleep(0.05)
    assert calls == 0
    wake.set()
    async with asyncio.timeout(5):
        await running.wait()
    wake.set()  # during the call: one more call after it
    release.set()
    await until(lambda: calls >= 2)
    await asyncio.sleep(0.05)
    assert calls == 2
    await tasks.stop()

    ticks = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1

    tasks.spawn(every(0.02, tick, "timed", wake=asyncio.Event()))  # wake or interval: interval
    await until(lambda: ticks >= 2)
    await tasks.stop()


async def test_every_refuses_a_loop_that_would_never_call() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        await every(0, lambda: None, "x")
    with pytest.raises(ValueError, match="interval_s"):
        await every(lambda: -1.0, lambda: None, "x")
    with pytest.raises(ValueError, match="wake"):
        await every(None, lambda: None, "x")
