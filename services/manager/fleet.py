"""The manager's view of the fleet, one object over its parts.

``Fleet`` keeps the surface the rest of the manager reads and changes; the work is in:

- services.manager.fleet_view: every aggregate as the event log has it, kept current by
  folding the log (the view);
- services.manager.fleet_indexes: what the scheduler and the reactors read without scanning
  (free room per agent, usage per owner, the pending queue, the agents' scheduler views);
- services.manager.session_locks: one change of a session at a time, and reloads of what
  another writer stored meanwhile;
- services.manager.fleet_writes: saves through the repository, and reloads after a refused one;
- services.manager.settled_waiters: creates waiting for their session to settle.

The parts share the view's tables (the same dicts, never copies).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from domain.events import ClusterMode, Resources
from domain.placement_index import AgentIndex
from domain.reservation import AgentReservations
from domain.scheduling import AgentView, PendingSession, Policy
from domain.session import Session
from domain.status import Kernel
from eventstore.bulk import BulkReader
from eventstore.repository import Repository
from eventstore.store import EventStore, Recorded, Write
from services.manager.agent_state import AgentState
from services.manager.bus import RoomFreed
from services.manager.fleet_indexes import FleetIndexes, is_settled
from services.manager.fleet_view import FleetView
from services.manager.fleet_writes import FleetWrites
from services.manager.reservations import Reservations
from services.manager.session_locks import SessionLocks
from services.manager.settled_waiters import SettledWaiters
from transport.tasks import Tasks

__all__ = ["AgentState", "Fleet", "is_settled"]


class Fleet:
    def __init__(
        self,
        store: EventStore,
        repository: Repository,
        publish: Callable[[object], None] = lambda message: None,
        bulk: BulkReader | None = None,
    ) -> None:
        self.store = store
        self.repository = repository
        self.publish = publish
        tasks = Tasks()  # the log follower and reloads
        self.view = view = FleetView(store, bulk, publish, tasks)
        self.waiters = SettledWaiters(view.sessions)
        # every agent's reservations (domain.reservation): the other account of its room; what
        # they change of an agent's room goes to the indexes, built next over them
        self.reservations = Reservations(
            repository,
            view.sessions.get,
            lambda agent_id, freed: self.indexes.room_changed(agent_id, freed),
        )
        self.indexes = indexes = FleetIndexes(
            view.sessions, view.agents, self.reservations, self._room_freed, self.waiters.settled
        )
        self.locks = SessionLocks(view.sessions, self.reload, tasks)
        self.writes = FleetWrites(
            repository, view.admin, indexes, self.locks, self.reservations, publish
        )
        view.attach(indexes, self.locks, self.reservations, indexes.reindex)
        # The tables, shared with the parts that keep them.
        self.agents = view.agents
        self.sessions = view.sessions
        self.resource_policies = view.resource_policies
        self.resource_groups = view.resource_groups
        self.users = view.users
        self.policies = view.policies
        self.admin = (
            view.admin
        )  # the four above and the dotfiles, by subject kind (the unit of work's)
        self.liveness = view.liveness
        self.image_sizes = view.image_sizes
        self.caught_up = view.caught_up
        self.kernel_session = indexes.kernel_session
        self.pending = indexes.pending
        self.owner_sessions = indexes.owner_sessions
        self.session_names = indexes.session_names
        self.owner_usage = indexes.owner_usage
        self.running_since = indexes.running_since
        self.running_order = indexes.running_order
        self.live_on_agent = indexes.live_on_agent
        self.pulling_on_agent = indexes.pulling_on_agent
        self.changed_agents = indexes.changed_agents
        self.image_last_used = indexes.image_last_used
        self.image_first_seen = indexes.image_first_seen

    def _room_freed(self) -> None:
        if self.caught_up.is_set():
            self.publish(RoomFreed())

    @property
    def last_seq(self) -> int:
        """The last stream sequence folded."""
        return self.view.last_seq

    @property
    def conflicts(self) -> int:
        """Session saves the store refused on their expected sequence (metrics)."""
        return self.writes.conflicts

    # -- the view ------------------------------------------------------------------------

    async def start(self) -> None:
        await self.view.start()

    async def stop(self) -> None:
        await self.view.stop()

    def fold(self, rec: Recorded) -> None:
        self.view.fold(rec)

    def agent_groups(self) -> set[str]:
        return self.view.agent_groups()

    def image_there_for(self, kernel: Kernel, image: str) -> bool:
        return self.view.image_there_for(kernel, image)

    def pulling_there(self, session: Session, agent_id: str) -> list[Kernel]:
        return self.view.pulling_there(session, agent_id)

    def image_there_on(self, session: Session, agent_id: str) -> bool:
        return self.view.image_there_on(session, agent_id)

    def unsettled_sessions(self) -> Iterable[str]:
        return self.view.unsettled_sessions()

    # -- the indexes ---------------------------------------------------------------------

    def reindex(self, session: Session) -> None:
        self.indexes.reindex(session)

    def never_holds(
        self,
        resources: Resources,
        cluster_size: int,
        cluster_mode: ClusterMode,
        resource_group: str,
    ) -> tuple[str, str] | None:
        return self.indexes.never_holds(resources, cluster_size, cluster_mode, resource_group)

    def agent_views(self) -> list[AgentView]:
        return self.indexes.agent_views()

    def agent_index(self, policy: Policy) -> AgentIndex:
        return self.indexes.agent_index(policy)

    def view_of(self, agent_id: str) -> AgentView:
        return self.indexes.view_of(agent_id)

    def pending_sessions(self) -> list[PendingSession]:
        return self.indexes.pending_sessions(self.locks.held)

    def sessions_on(self, agent_id: str) -> list[str]:
        return self.indexes.sessions_on(agent_id)

    # -- locks ---------------------------------------------------------------------------

    def try_lock(self, session_id: str) -> bool:
        return self.locks.try_lock(session_id)

    async def lock(self, session_id: str) -> None:
        await self.locks.lock(session_id)

    def release_now(self, session_id: str) -> None:
        self.locks.release_now(session_id)

    async def unlock(self, session_id: str) -> None:
        await self.locks.unlock(session_id)

    async def committed(self, session_id: str) -> Session | None:
        return await self.locks.committed(session_id)

    @asynccontextmanager
    async def locked(self, session_id: str) -> AsyncIterator[Session | None]:
        async with self.locks.locked(session_id) as session:
            yield session

    def mark_stale(self, session_id: str) -> None:
        self.locks.mark_stale(session_id)

    # -- saves ---------------------------------------------------------------------------

    async def commit(
        self,
        session: Session,
        request_id: str | None = None,
        actor: str | None = None,
        also: Sequence[Write] = (),
    ) -> bool:
        return await self.writes.commit(session, request_id, actor, also)

    async def commit_together(
        self,
        sessions: list[Session],
        reservations: list[AgentReservations],
        also: Sequence[Write] = (),
    ) -> bool:
        return await self.writes.commit_together(sessions, reservations, also)

    async def reload_or_mark_stale(self, session_id: str) -> None:
        await self.writes.reload_or_mark_stale(session_id)

    async def reload(self, session_id: str) -> None:
        await self.writes.reload(session_id)

    async def save_admin(self, aggregate: Any, kind: str) -> None:
        await self.writes.save_admin(aggregate, kind)

    # -- waiting -------------------------------------------------------------------------

    async def wait_settled(self, session_id: str, within_s: float) -> None:
        """Return when the session is RUNNING or final, or after ``within_s`` seconds."""
        await self.waiters.wait_settled(session_id, within_s)
