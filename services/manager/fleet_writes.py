"""What the manager saves through the repository: sessions, agents' reservations and the
aggregates an admin sets, and the reloads that follow a save the store refused.

A session is saved with optimistic concurrency from the sequence it was loaded at; saved, its
indexes follow it, refused (another writer, a fence, no answer), it is reloaded from the log so
the caller decides again on what is really there.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from domain.reservation import AgentReservations
from domain.session import Session
from eventstore.repository import NotFound, Repository
from eventstore.store import ConcurrencyError, StoreError, Write
from services.manager.bus import LookAgain
from services.manager.fleet_indexes import FleetIndexes
from services.manager.requester import requester
from services.manager.reservations import Reservations
from services.manager.session_locks import SessionLocks

log = logging.getLogger(__name__)


class FleetWrites:
    def __init__(
        self,
        repository: Repository,
        admin: dict[str, dict[str, Any]],
        indexes: FleetIndexes,
        locks: SessionLocks,
        reservations: Reservations,
        publish: Callable[[object], None],
    ) -> None:
        self.repository = repository
        self.admin = admin  # the view's admin-set aggregates, by subject kind
        self.indexes = indexes
        self.locks = locks
        self.reservations = reservations
        self.publish = publish
        self.conflicts = 0  # session saves the store refused on its expected sequence (metrics)

    async def commit(
        self,
        session: Session,
        request_id: str | None = None,
        actor: str | None = None,
        also: Sequence[Write] = (),
    ) -> bool:
        """Save the session's pending events (the caller holds its lock) with ``also`` (a
        leader's fence) in the same append; True if stored.

        On a conflict or a store error the session is reloaded from the log and False
        returned: the caller decides again on what is really there."""
        try:
            await self.repository.save(session, request_id=request_id, actor=actor, also=also)
        except (ConcurrencyError, StoreError) as e:
            self.conflicts += isinstance(e, ConcurrencyError)
            log.warning("session %s not saved (%s): reloading it", session.id, e)
            await self.reload_or_mark_stale(session.id)
            return False
        self.indexes.reindex(session)
        return True

    async def commit_together(
        self,
        sessions: list[Session],
        reservations: list[AgentReservations],
        also: Sequence[Write] = (),
    ) -> bool:
        """Save sessions (their locks held) and agents' reservations in one atomic append,
        each expecting the subject where it was loaded; True if stored.  Refused (another
        writer moved one of them, or a fence), every one of them is reloaded from the log."""
        agents = [r.id for r in reservations]  # begun by the caller, before it awaited
        stored = False
        try:
            await self.repository.save(*sessions, *reservations, also=also)
            stored = True
        except (ConcurrencyError, StoreError) as e:
            log.warning("%d sessions not scheduled (%s): reloading them", len(sessions), e)
            for session in sessions:
                with contextlib.suppress(StoreError):  # marked stale: the next lock reloads
                    await self.reload_or_mark_stale(session.id)
        finally:
            try:
                await self.reservations.end(agents, stored)
            except StoreError as e:  # kept stale: the next pass reloads them first
                log.warning("reservations not reloaded (%s); the next pass tries again", e)
        if stored:
            for session in sessions:
                self.indexes.reindex(session)
        return stored

    async def reload_or_mark_stale(self, session_id: str) -> None:
        """Drop what the cached session holds beyond the log: reload it; if the store does not
        answer, mark it stale (the next lock reloads it, a task keeps trying) and raise."""
        try:
            await self.reload(session_id)
        except StoreError:
            self.locks.mark_stale(session_id)
            raise

    async def reload(self, session_id: str) -> None:
        try:
            session = await self.repository.get(Session, session_id)
        except NotFound:
            self.indexes.forget(session_id)
            return
        self.indexes.reindex(session)
        self.publish(LookAgain(session_id))

    async def save_admin(self, aggregate: Any, kind: str) -> None:
        """Save an aggregate an admin set (over hoist.admin) and keep it in the view: the
        unit of work's (services.manager.uow), which publishes its events.  ConcurrencyError:
        another writer meanwhile."""
        # A fresh key makes the append idempotent, so the store sends it again while a
        # cluster elects a new stream leader (a node's loss) instead of failing the admin.
        key = uuid.uuid4().hex
        await self.repository.save(aggregate, request_id=key, actor=requester("admin"))
        self.admin[kind][aggregate.id] = aggregate
