"""Per-session locks: one change of a session at a time, and reloads of what others wrote.

Each session is changed under its lock (services.manager.uow).  A record on a session's subject
we did not write, seen while the session is held, is remembered (``saw``): on release the
session reloads from the store.  A cached session that may hold what the log does not (its save
failed and so did the reload) is stale: the next lock reloads it first, and a task keeps trying
meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from domain.session import Session
from eventstore.repository import loaded_seq
from eventstore.store import StoreError
from transport.tasks import Tasks

log = logging.getLogger(__name__)


class SessionLocks:
    def __init__(
        self,
        sessions: dict[str, Session],
        reload: Callable[[str], Awaitable[None]],
        tasks: Tasks,
    ) -> None:
        self.sessions = sessions  # the view's, shared
        self.reload = reload  # the session from the store into the view
        self._tasks = tasks
        self.held: dict[str, asyncio.Event] = {}  # session id -> set when released
        self._seen: dict[str, int] = {}  # highest seq seen per session subject while locked
        # Cached sessions that hold a change the log may not have (its append failed and so did
        # the reload): the next lock reloads them first, and a task keeps trying meanwhile.
        self._stale: set[str] = set()

    def busy(self, session_id: str) -> bool:
        """Held, or stale: a record on its subject is not applied to the cached session."""
        return session_id in self.held or session_id in self._stale

    def saw(self, session_id: str, seq: int) -> None:
        """Another writer's record at ``seq`` is on the session's subject: reload it, now if
        nobody holds it, else on release."""
        self._seen[session_id] = max(seq, self._seen.get(session_id, 0))
        if session_id not in self.held:
            self._tasks.spawn(self._reload_locked(session_id), f"reload {session_id}")

    def try_lock(self, session_id: str) -> bool:
        if session_id in self.held or session_id in self._stale:
            return False
        self.held[session_id] = asyncio.Event()
        return True

    async def lock(self, session_id: str) -> None:
        while (held := self.held.get(session_id)) is not None:
            await held.wait()
        self.held[session_id] = asyncio.Event()
        if session_id in self._stale:
            try:
                await self.reload(session_id)
            except BaseException:
                self.held.pop(session_id).set()
                raise
            self._stale.discard(session_id)

    def release_now(self, session_id: str) -> None:
        """Release a lock taken with try_lock under which nothing was recorded."""
        self.held.pop(session_id).set()
        if self._seen.get(session_id, 0) > loaded_seq(self.sessions[session_id]):
            self._tasks.spawn(self._reload_locked(session_id), f"reload {session_id}")

    async def unlock(self, session_id: str) -> None:
        """Release; first reload if someone else wrote the session meanwhile."""
        try:
            session = self.sessions.get(session_id)
            seen = self._seen.pop(session_id, 0)
            if seen and (session is None or seen > loaded_seq(session)):
                await self.reload(session_id)
        finally:
            self.held.pop(session_id).set()

    async def committed(self, session_id: str) -> Session | None:
        """The session as the log has it. A change applies its events to the cached session
        before they are saved, so a reader waits out a change in flight: no reply ever shows
        a status the log might never get (a crash before the append)."""
        while (held := self.held.get(session_id)) is not None:
            await held.wait()
        return self.sessions.get(session_id)

    @asynccontextmanager
    async def locked(self, session_id: str) -> AsyncIterator[Session | None]:
        """Hold the session's lock; yields the cached session (None if unknown)."""
        await self.lock(session_id)
        try:
            yield self.sessions.get(session_id)
        finally:
            await self.unlock(session_id)

    def mark_stale(self, session_id: str) -> None:
        """The cached session may hold what the log does not (a save cancelled or unanswered):
        the next lock reloads it, and a task keeps trying until one does."""
        if session_id not in self._stale:
            self._stale.add(session_id)
            self._tasks.spawn(self._refresh(session_id), f"refresh {session_id}")

    async def _refresh(self, session_id: str) -> None:
        """Reload a stale session as soon as the store answers again."""
        while session_id in self._stale:
            await asyncio.sleep(1.0)
            try:
                async with self.locked(session_id):  # lock() reloads a stale session
                    pass
            except StoreError as e:
                log.warning("session %s still not reloaded: %s", session_id, e)

    async def _reload_locked(self, session_id: str) -> None:
        async with self.locked(session_id) as session:
            if session is None or self._seen.get(session_id, 0) > loaded_seq(session):
                self._seen.pop(session_id, None)
                await self.reload(session_id)
