"""Background tasks a part owns, and periodic loops: one helper each.

``Tasks`` keeps the tasks a part spawns (a request handler, a loop, a pull) so they are
neither garbage-collected while running nor forgotten at stop: ``stop()`` cancels them all and
waits until every one has ended.  A task that fails is logged when it ends (its exception is
retrieved, so asyncio never warns of it).

``every(interval_s, fn, what)`` is the loop coroutine behind every periodic check: call
``fn`` (sync or async) every ``interval_s`` seconds, log an exception and go on; ``wake`` (an
asyncio.Event) calls it early; ``interval_s`` None calls it only when woken.  Run it in a
``Tasks``: ``tasks.spawn(every(5.0, self.check, "pull check"), name="pull check")``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, NoReturn, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# stop() cancels again after this long: on Python 3.11 a cancel that lands as an
# asyncio.timeout or wait_for inside the task expires (nats-py requests use one) is taken for
# the timeout and swallowed, and the task would go on for ever.
RECANCEL_S = 0.5


class Tasks:
    """The background tasks of one owner: ``spawn`` them, ``await stop()`` ends them all."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        """Run ``coro`` in a task of this group; the task is forgotten when it ends."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (e := task.exception()) is not None:
            log.error("task %s failed", task.get_name(), exc_info=e)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    async def stop(self) -> None:
        """Cancel every task (spawned before or while stopping) and wait until all have ended;
        a task that swallowed its cancel is cancelled again every RECANCEL_S."""
        await cancel_all(self._tasks)


async def cancel_all(tasks: set[asyncio.Task[Any]] | list[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` until every one has ended (``tasks`` may grow meanwhile: a set a
    done-callback shrinks, as Tasks keeps)."""
    while pending := {t for t in tasks if not t.done()}:
        for t in pending:
            t.cancel()
        await asyncio.wait(pending, timeout=RECANCEL_S)


async def every(
    interval_s: float | Callable[[], float] | None,
    fn: Callable[[], object],
    what: str,
    *,
    wake: asyncio.Event | None = None,
    now: bool = False,
) -> NoReturn:
    """Call ``fn`` every ``interval_s`` seconds (the first call after one interval, or at once
    with ``now``) until cancelled.  ``wake.set()`` calls it at once (a wake while it runs calls
    it again right after); ``interval_s`` None calls it only when woken, a function is asked
    for each wait (an interval that changes).  An exception ``fn`` raises is logged as
    "``what`` failed" and the loop goes on."""

    def interval() -> float | None:
        return interval_s() if callable(interval_s) else interval_s

    first = interval()
    if first is not None and not first > 0:
        raise ValueError(f"interval_s must be > 0 seconds, got {first!r}")
    if interval_s is None and wake is None:
        raise ValueError("every() without an interval needs a wake event")
    if now:
        await _call(fn, what)
    while True:
        if wake is None:
            await asyncio.sleep(interval() or 0)  # not None without a wake: checked above
        else:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval()):
                    await wake.wait()
            wake.clear()
        await _call(fn, what)


async def _call(fn: Callable[[], object], what: str) -> None:
    try:
        result = fn()
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("%s failed", what)
    # Let what the call started (saves, new requests) run before the next call.
    await asyncio.sleep(0)
