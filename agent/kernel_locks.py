"""One lock per kernel with a create or destroy in flight on this agent."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Collection


class KernelLocks:
    """A kernel's create and destroy run one at a time.  A lock lives while anyone holds or
    waits for it: an agent sees kernels without end, so the entry goes with the last user."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: defaultdict[str, int] = defaultdict(int)
        self.work_ended_at = -math.inf  # when a create or destroy here last ended (monotonic)

    @contextlib.asynccontextmanager
    async def hold(self, kernel_id: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(kernel_id, asyncio.Lock())
        self._users[kernel_id] += 1
        try:
            async with lock:
                yield
        finally:
            self._users[kernel_id] -= 1
            if not self._users[kernel_id]:
                del self._users[kernel_id], self._locks[kernel_id]
            self.work_ended_at = time.monotonic()

    def in_flight(self, kernel_id: str) -> bool:
        """A create (or destroy) of the kernel holds its lock now."""
        lock = self._locks.get(kernel_id)
        return lock is not None and lock.locked()

    def any_in_flight(self, besides: Collection[str]) -> bool:
        """Whether the work of a kernel not in ``besides`` is under way."""
        return any(self.in_flight(k) for k in self._locks if k not in besides)
