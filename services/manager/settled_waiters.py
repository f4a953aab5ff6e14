"""Creates with ``max_wait`` waiting for their session to be RUNNING or final."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from domain.session import Session
from services.manager.fleet_indexes import is_settled


class SettledWaiters:
    def __init__(self, sessions: dict[str, Session]) -> None:
        self.sessions = sessions  # the view's, shared
        self._waiters: defaultdict[str, list[asyncio.Future[None]]] = defaultdict(list)

    def settled(self, session_id: str) -> None:
        """The session is RUNNING or final: wake whoever waits for it."""
        for fut in self._waiters.pop(session_id, ()):
            if not fut.done():
                fut.set_result(None)

    async def wait_settled(self, session_id: str, within_s: float) -> None:
        """Return when the session is RUNNING or final, or after ``within_s`` seconds."""
        session = self.sessions.get(session_id)
        if session is None or is_settled(session) or within_s <= 0:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[session_id].append(fut)
        try:
            async with asyncio.timeout(within_s):  # wait_for can lose a cancel on 3.11
                await fut
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(session_id)
            if waiters and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    self._waiters.pop(session_id, None)
