"""The unit of work: the one way the manager changes an aggregate.

    async with uow.session(session_id, actor="client") as s:
        s.destroy(forced)

holds the session's lock, hands the block the session as the manager's view has it, and on
leaving saves what the block's commands recorded, expecting the subject where the session was
loaded (optimistic concurrency).  On a conflict (or a write the store did not take) the view
reloads the session from the log and the block's commands are called again on it: decisions
live on the aggregate and look at its state, so calling them again decides again on what is
really there.  What was stored is then published on the bus (services.manager.bus).

A periodic loop's change is fenced (``fenced``): it decides on time or on the leader's
memory, so it is stored only while this manager leads (services.manager.leadership), and a
paused ex-leader's is refused.

A block that raises leaves nothing recorded: the session is reloaded (the commands before the
one that raised had already applied their events to the view's copy) and the error goes on; so
does a DomainError of a command called again after a conflict.  A store error the view cannot
recover from goes on as StoreError, and the view reloads that session before anyone decides on
it again (services.manager.fleet).

An aggregate an admin sets (a user, a resource group or policy, a prepull policy) is changed
the same way, by ``admin(kind, name, decide)``: ``decide`` gets a copy of it as the view folded
it (the view's stays as the log has it until the save lands) and raises a domain error to
refuse; another writer meanwhile is a Conflict the admin sends again.  Handlers raise domain
errors only: the responder (services.manager.responder) maps them to wire errors.

The one write outside it is an agent's loss (services.manager.liveness): the liveness watcher
decides on the log itself, not on the view, so a manager whose view lags never marks an agent
lost on beats it has not folded yet; its append is fenced like a loop's.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar, cast

from eventsourcing.domain import BaseAggregate

from domain.errors import Conflict, DomainError, NotFound, unknown_session
from domain.reservation import AgentReservations
from domain.session import Session
from eventstore.store import ConcurrencyError, StoreError, Write
from services.manager.fleet import Fleet
from services.manager.leadership import NotLeading

log = logging.getLogger(__name__)

ATTEMPTS = 5
A = TypeVar("A", bound=BaseAggregate[Any])


class SessionUnknown(NotFound):
    """No such session in the view (and so in the log)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__("session_id", unknown_session(session_id))


class KeptChanging(StoreError):
    """The session changed under every attempt, or the store did not take the write."""


class UnitOfWork:
    def __init__(
        self,
        fleet: Fleet,
        publish: Callable[[object], None],
        fence: Callable[[], Sequence[Write]] = tuple,
    ) -> None:
        self.fleet = fleet
        self.publish = publish
        self.fence = fence  # the leader's (services.manager.leadership); none: one manager

    @asynccontextmanager
    async def session(
        self, session_id: str, *, actor: str | None = None, fenced: bool = False
    ) -> AsyncIterator[Session]:
        await self.fleet.lock(session_id)
        try:
            session = self.fleet.sessions.get(session_id)
            if session is None:
                raise SessionUnknown(session_id)
            recording = _Recording(session)
            try:
                yield cast(Session, recording)
            except BaseException:
                if session.pending_events:
                    session.collect_events()
                    await self.fleet.reload_or_mark_stale(session_id)
                raise
            for _ in range(ATTEMPTS):
                try:
                    if await self._save(session, actor, fenced):
                        return
                except NotLeading:
                    session.collect_events()
                    await self.fleet.reload_or_mark_stale(session_id)
                    raise
                except asyncio.CancelledError:
                    # Cancelled mid-append (this manager stopped leading, or stops): the view
                    # holds the change whether or not the log took it; the next lock reloads.
                    session.collect_events()
                    self.fleet.mark_stale(session_id)
                    raise
                fresh = self.fleet.sessions.get(session_id)
                if fresh is None:
                    raise SessionUnknown(session_id)
                session = fresh
                try:
                    recording.replay_on(session)
                except DomainError:
                    # The change no longer applies to what the log has: say why, save nothing.
                    session.collect_events()
                    await self.fleet.reload_or_mark_stale(session_id)
                    raise
            raise KeptChanging(f"session {session_id} kept changing")
        finally:
            await self.fleet.unlock(session_id)

    async def change(
        self,
        session_id: str,
        decide: Callable[[Session], None],
        *,
        fenced: bool,
        actor: str | None = None,
    ) -> bool:
        """``decide(session)`` in ``session()``, for the manager's own reactions: True if it
        stored something, or the session was reloaded under a stale decision (look again);
        False if nothing was due or the session is unknown.  A DomainError is logged."""
        try:
            async with self.session(session_id, actor=actor, fenced=fenced) as session:
                before = len(session.pending_events)
                decide(session)
                return len(session.pending_events) > before
        except SessionUnknown:
            return False
        except DomainError as e:
            log.warning("session %s: %s", session_id, e)
            return True

    async def try_change(
        self, session_id: str, decide: Callable[[Session], None], *, fenced: bool
    ) -> bool:
        """``change()`` for a periodic loop, which tries again next round: a store error is
        logged and the loop goes on with its other sessions.  ``fenced`` for a loop's
        decision (on time or on the leader's memory), not for a reaction to an event."""
        try:
            return await self.change(session_id, decide, fenced=fenced)
        except StoreError as e:
            log.warning("session %s not changed (%s); the next round tries again", session_id, e)
            return False

    async def add(self, session: Session, *, actor: str) -> Session:
        """Store a new session; if its id is taken (a retried create), the stored one."""
        async with self.fleet.locked(session.id) as existing:
            if existing is not None:
                return existing
            if not await self._save(session, actor):
                stored = self.fleet.sessions.get(session.id)
                if stored is None:
                    raise KeptChanging("the event store did not take the session")
                return stored
            return session

    async def admin(
        self,
        kind: str,
        name: str,
        decide: Callable[[A | None], A],
        *,
        dry_run: bool = False,
    ) -> tuple[A, bool]:
        """``decide`` on a copy of the admin-set aggregate ``name`` of subject ``kind`` (None if
        never set) and save what it recorded (unless ``dry_run``): the aggregate as decided,
        and whether it was recorded.  Another writer meanwhile is a Conflict (send it again)."""
        folded = self.fleet.admin[kind].get(name)
        aggregate = decide(None if folded is None else copy.deepcopy(folded))
        if dry_run or not aggregate.pending_events:
            aggregate.collect_events()
            return aggregate, False
        events = list(aggregate.pending_events)
        try:
            await self.fleet.save_admin(aggregate, kind)
        except ConcurrencyError:
            raise Conflict(
                "name", f"{name!r} changed meanwhile (another admin's change); send it again"
            ) from None
        for event in events:
            self.publish(event)
        return aggregate, True

    def change_now(
        self, session_id: str, change: Callable[[Session], None]
    ) -> Awaitable[bool] | None:
        """For the scheduler, which must reserve room before it awaits anything: apply
        ``change`` now if nobody holds the session (None if somebody does, or it recorded
        nothing), bring the view's indexes in line, and return the save to await."""
        session = self.claim(session_id, change)
        return None if session is None else self._save_claimed(session)

    def claim(self, session_id: str, change: Callable[[Session], None]) -> Session | None:
        """``change`` the session now if nobody holds it, and keep holding it (None if somebody
        does, or it recorded nothing); the view's indexes follow at once.  The caller saves it
        with ``save_claimed``."""
        session = self.fleet.sessions.get(session_id)
        if session is None or not self.fleet.try_lock(session_id):
            return None
        try:
            change(session)
        except Exception:
            applied = session.collect_events()
            self.fleet.release_now(session_id)
            if applied:  # an earlier command of ``change`` moved the cached session: reload it
                self.fleet.mark_stale(session_id)
            raise
        if not session.pending_events:
            self.fleet.release_now(session_id)
            return None
        self.fleet.reindex(session)
        return session

    async def _save_claimed(self, session: Session) -> bool:
        try:
            return await self._save(session, None)
        finally:
            await self.fleet.unlock(session.id)

    async def save_claimed(
        self,
        sessions: list[Session],
        reservations: list[AgentReservations],
        also: Sequence[Write] = (),
    ) -> bool:
        """Save claimed sessions with the agents' reservations in one atomic append, then
        release them; False if it was refused (all of it reloaded: decide again)."""
        events = [e for s in sessions for e in s.pending_events]
        try:
            stored = await self.fleet.commit_together(sessions, reservations, also)
        finally:
            for session in sessions:
                await self.fleet.unlock(session.id)
        if stored:
            for event in events:
                self.publish(event)
        return stored

    async def _save(self, session: Session, actor: str | None, fenced: bool = False) -> bool:
        """True if stored; False after a conflict (the view reloaded the session).  A store
        error the view could not recover from by a reload goes on (StoreError); NotLeading
        for a fenced save of a manager that does not lead (nothing saved, nothing reloaded)."""
        events = list(session.pending_events)
        also = self.fence() if fenced else ()
        stored = await self.fleet.commit(session, actor=actor, also=also)
        if stored:
            for event in events:
                self.publish(event)
        return stored


class Removable(Protocol):
    removed: bool

    def remove(self) -> None: ...


R = TypeVar("R", bound=Removable)


def removal(missing: str) -> Callable[[R | None], R]:
    """The ``decide`` of an admin's remove: NotFound naming ``name`` (``missing`` says what to do)
    when the aggregate was never set or is removed already."""

    def decide(aggregate: R | None) -> R:
        if aggregate is None or aggregate.removed:
            raise NotFound("name", missing)
        aggregate.remove()
        return aggregate

    return decide


class _Recording:
    """The session as a unit of work's block sees it: every command called is remembered, so
    it can be called again on the session reloaded after a conflict."""

    __slots__ = ("_calls", "_session")

    def __init__(self, session: Session) -> None:
        self._session = session
        self._calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._session, name)
        if name.startswith("_") or name not in _COMMANDS:
            return value

        def command(*args: Any, **kwargs: Any) -> Any:
            self._calls.append((name, args, kwargs))
            return value(*args, **kwargs)

        return command

    def replay_on(self, session: Session) -> None:
        """Call the block's commands again on ``session`` (a DomainError: one no longer
        applies to it)."""
        self._session = session
        for name, args, kwargs in self._calls:
            getattr(session, name)(*args, **kwargs)


# The public methods of Session that record events (properties and reads are not commands).
_COMMANDS = frozenset(
    name
    for name, member in vars(Session).items()
    if callable(member) and not name.startswith("_") and name not in {"kernel", "enqueue"}
)
