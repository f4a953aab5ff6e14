"""The manager's in-memory view: every agent and session as the event log says, kept current.

Built by folding the whole log on start, then every new event as it is stored (one ordered
consumer); nothing here is state the log cannot rebuild.  Each session it folds is handed to
the scheduling indexes (services.manager.fleet_indexes), kept beside it.

Only the manager writes session subjects, and each session is changed under its lock through
the unit of work (services.manager.uow): the cached aggregate is mutated by the command and
saved with optimistic concurrency from the sequence it was loaded at, so no event is re-read
after our own write.  What the fold learns once caught up is published on the message bus.
An event on a session subject we did not write (another manager, a write that landed after a
timeout) makes the session reload from the store.

A record domain.admission refuses (it does not decode, is not bound to its subject, or cannot
apply) is logged once and skipped; the fold goes on.  An agent is lost when its latest
AgentLost (on its liveness subject, the manager's) is later in the stream than its latest
(re)registration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from domain import events as ev
from domain.admission import Inadmissible, admit, binding, fold
from domain.image_ref import canonical_or_same
from domain.liveness import AgentLiveness
from domain.prepull import PrepullPolicy
from domain.quota import ResourcePolicy
from domain.resource_group import ResourceGroup
from domain.session import Session, sent_back
from domain.status import Kernel, KernelStatus
from domain.subjects import (
    DOTFILES,
    LEASE,
    LIVENESS,
    PREPULL_POLICY,
    RESERVATION,
    RESOURCE_GROUP,
    RESOURCE_POLICY,
    USER,
)
from domain.user import User
from eventstore.bulk import BULK_MIN, BulkReader
from eventstore.quarantine import quarantined
from eventstore.repository import loaded_seq, passed
from eventstore.store import EventStore, Recorded, StoreError
from services.manager.agent_state import AgentState
from services.manager.bus import LookAgain
from services.manager.fleet_indexes import FleetIndexes, is_settled
from services.manager.reservations import Reservations
from services.manager.session_locks import SessionLocks
from transport.tasks import Tasks

log = logging.getLogger(__name__)

S = KernelStatus
FOLLOW_RETRY_S = 0.5  # the first pause before following the log again after a failed read
FOLLOW_RETRY_MAX_S = 10.0


class FleetView:
    """Every aggregate as the log has it, and the follower that keeps it so."""

    def __init__(
        self,
        store: EventStore,
        bulk: BulkReader | None,
        publish: Callable[[object], None],
        tasks: Tasks,
    ) -> None:
        self.store = store
        # Reads a long start-up fold in a child process (eventstore.bulk): parsing the
        # records is much of a long fold, and would otherwise hold the manager's loop.
        self.bulk = bulk
        # Where what the fold learns goes once caught up (services.manager.bus): agent,
        # liveness and policy events as folded, LookAgain.
        self.publish = publish
        self._tasks = tasks  # the log follower
        self.agents: dict[str, AgentState] = {}
        self.sessions: dict[str, Session] = {}
        self.resource_policies: dict[str, ResourcePolicy] = {}  # removed ones too
        # group -> who may use it, as an admin defined it (removed ones too; domain.resource_group)
        self.resource_groups: dict[str, ResourceGroup] = {}
        self.users: dict[str, User] = {}  # Hoist users (domain.user), disabled ones too
        self.last_seq = 0  # the last stream sequence folded
        self.policies: dict[str, PrepullPolicy] = {}  # prepull policies, removed ones too
        # The aggregates an admin sets through the manager, by subject kind: folded, and saved
        # by the unit of work (services.manager.uow), one way.
        self.admin: dict[str, dict[str, Any]] = {
            PREPULL_POLICY: self.policies,
            RESOURCE_POLICY: self.resource_policies,
            RESOURCE_GROUP: self.resource_groups,
            USER: self.users,
            DOTFILES: {},  # owner -> their dotfiles (domain.dotfiles)
        }
        self.liveness: dict[str, AgentLiveness] = {}  # agent id -> its losses
        self.caught_up = asyncio.Event()
        # image -> its size in bytes as an agent last reported it (locality weighs bytes)
        self.image_sizes: dict[str, int] = {}

    def attach(
        self,
        indexes: FleetIndexes,
        locks: SessionLocks,
        reservations: Reservations,
        reindex: Callable[[Session], None],
    ) -> None:
        """The parts the fold keeps in line; they are built over this view's tables."""
        self.indexes = indexes
        self.locks = locks
        self.reservations = reservations
        self.reindex = reindex

    # -- following the log ---------------------------------------------------------------

    async def start(self) -> None:
        """Fold the log up to its current end, then keep following it."""
        info = await self.store.js.stream_info(self.store.stream)
        target = info.state.last_seq
        if target == 0:
            self.caught_up.set()
        else:  # indexes and surpluses counted once the fold is done (_follow_log)
            self.indexes.defer_until_caught_up()
            self.reservations.defer()
        follow = self._tasks.spawn(self._follow_log(target), "follow the event log")
        waiter = asyncio.create_task(self.caught_up.wait())
        done, _ = await asyncio.wait({waiter, follow}, return_when=asyncio.FIRST_COMPLETED)
        if follow in done:
            waiter.cancel()
            follow.result()  # raises what stopped it
            raise RuntimeError("the event log consumer ended before catching up")

    async def stop(self) -> None:
        await self._tasks.stop()

    async def _follow_log(self, target: int) -> None:
        """Fold the log up to ``target`` (its end at start), then for ever.  A read the store
        does not answer (a timeout under load, a lost connection) is not the end: follow again
        from the next record, after a pause that grows while it keeps failing, so the view
        never stops moving with the log."""
        delay = FOLLOW_RETRY_S
        while True:
            try:
                if not self.caught_up.is_set():
                    # A bounded read, not "until a record at target": the log's last records
                    # may be gone by now (a lease's TTL lapsed during a long fold), and nothing
                    # new need come (a lone manager restarting), so no such record may arrive.
                    await self._fold_bulk(target)
                    async for rec in self.store.replay(
                        from_seq=self.last_seq + 1, until_seq=target
                    ):
                        self._take(rec)
                        delay = FOLLOW_RETRY_S
                    self.last_seq = max(self.last_seq, target)  # what is missing expired
                    self.indexes.index_deferred()
                    self.reservations.flush()
                    self.caught_up.set()
                async for rec in self.store.replay(from_seq=self.last_seq + 1, follow=True):
                    self._take(rec)
                    delay = FOLLOW_RETRY_S
                return  # a follow=True replay only ends when cancelled
            except (StoreError, TimeoutError) as e:
                log.warning(
                    "following the event log after %d failed (%s); again in %gs",
                    self.last_seq,
                    e,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, FOLLOW_RETRY_MAX_S)

    async def _fold_bulk(self, target: int) -> None:
        """Fold up to ``target`` through the bulk reader's child, if there is one and the
        stretch is long; a child that fails leaves the rest to the in-process read."""
        if self.bulk is None or target - self.last_seq < BULK_MIN:
            return
        pages = self.bulk.pages_while_it_reads(self.last_seq + 1, target)
        async with contextlib.aclosing(pages):
            async for page in pages:
                for rec in page:
                    self._take(rec)

    def _take(self, rec: Recorded) -> None:
        """Fold one record of the log; one that fails to fold is logged and passed over."""
        try:
            self.fold(rec)
        except Exception:
            log.exception("event %s on %s not folded", rec.seq, rec.subject)
        self.last_seq = rec.seq

    def fold(self, rec: Recorded) -> None:
        try:
            kind, aggregate_id = binding(rec.subject)
            if kind == "session" and rec.seq <= _loaded(self.sessions.get(aggregate_id)):
                return  # our own write, applied when we made it: not decoded again
            event = admit(rec.subject, rec.headers, rec.data)
            if kind == "session":
                self._fold_session(aggregate_id, rec, event)
            elif kind == "agent":
                self._fold_agent(aggregate_id, rec, event)
            elif kind == LIVENESS:
                self._fold_liveness(aggregate_id, rec, event)
            elif kind == RESERVATION:
                self.reservations.fold(aggregate_id, rec, event, _applied)
            elif kind == LEASE:
                pass  # the managers' lease: services.manager.leadership reads it
            else:
                self._fold_admin(self.admin[kind], aggregate_id, rec, event)
        except Inadmissible as e:
            quarantined(rec.seq, rec.subject, rec.headers, e.reason, "manager")

    def _fold_admin(self, table: dict[str, Any], name: str, rec: Recorded, event: ev.Event) -> None:
        aggregate = table.get(name)
        if aggregate is not None and rec.seq <= loaded_seq(aggregate):
            return  # our own write, kept by the unit of work
        table[name] = _applied(aggregate, event, rec)
        if self.caught_up.is_set():
            self.publish(event)

    def agent_groups(self) -> set[str]:
        """The resource groups some registered agent (live or not) joined."""
        return {s.agent.resource_group for s in self.agents.values()}

    def _fold_liveness(self, agent_id: str, rec: Recorded, event: ev.Event) -> None:
        liveness = _applied(self.liveness.get(agent_id), event, rec)
        self.liveness[agent_id] = liveness
        state = self.agents.get(agent_id)
        if state is None:
            return  # lost before it registered: nothing to mark (never recorded by Hoist)
        state.liveness = liveness
        self.indexes.agent_changed(agent_id, room=True)
        if self.caught_up.is_set():
            self.publish(event)

    def _fold_session(self, session_id: str, rec: Recorded, event: ev.Event) -> None:
        seq = rec.seq
        session = self.sessions.get(session_id)
        if not self.caught_up.is_set():
            try:
                session = _applied(session, event, rec)
            except Inadmissible:
                if session is not None:
                    passed(session, seq)  # the subject moved on: a save must expect that
                raise
            self.indexes.take(session)
            return
        # Someone else wrote this session (another manager, or a write of ours that landed
        # after its timeout).  Nobody here holds it: the view has every earlier record of its
        # subject (the log comes in order), so the record applies as the next one; one that
        # does not apply makes it reload.  Held: our write's ack may not be back yet, so the
        # lock holder checks on release.
        if not self.locks.busy(session_id):
            try:
                session = _applied(session, event, rec)
            except Inadmissible:
                pass
            else:
                self.reindex(session)
                self.publish(LookAgain(session_id))
                return
        self.locks.saw(session_id, seq)

    def _fold_agent(self, agent_id: str, rec: Recorded, event: ev.Event) -> None:
        seq = rec.seq
        state = self.agents.get(agent_id)
        before = _room_of(state)
        agent = _applied(state.agent if state else None, event, rec)
        if state is None:
            state = self.agents[agent_id] = AgentState(agent, liveness=self.liveness.get(agent_id))
        state.agent = agent
        if isinstance(event, ev.AgentRegistered | ev.AgentReregistered):
            state.registered_seq = seq
        self.indexes.agent_changed(agent_id, room=_room_of(state) != before)
        image = canonical_or_same(getattr(event, "image", ""))  # older events: short forms
        if isinstance(event, ev.ImagePulled) and event.size_bytes:
            self.image_sizes[image] = event.size_bytes
        elif isinstance(event, ev.AgentRegistered | ev.AgentReregistered):
            for image, held in agent.images.items():
                if held.size_bytes:
                    self.image_sizes[image] = held.size_bytes
        if isinstance(event, ev.ImagePullFailed):
            state.failed_pulls[image] = (event.task_id, event.reason)
        elif isinstance(event, ev.ImagePullStarted | ev.ImagePulled):
            state.failed_pulls.pop(image, None)
            if isinstance(event, ev.ImagePulled):
                state.pulled[image] = event.task_id
        elif isinstance(event, ev.AgentReregistered):
            state.failed_pulls.clear()
        if self.caught_up.is_set():
            self.publish(event)

    def image_there_for(self, kernel: Kernel, image: str) -> bool:
        """The view shows ``kernel``'s agent holding ``image``, for this kernel: one a create
        sent back for its image (``image-missing``) waits until the view has seen the pull it
        waits for finish, as the image the view shows may be the one that was gone."""
        state = self.agents.get(kernel.agent_id or "")
        if state is None or image not in state.agent.images:
            return False
        return not sent_back(kernel) or state.pulled.get(image) == kernel.pull_task_id

    def pulling_there(self, session: Session, agent_id: str) -> list[Kernel]:
        """The session's PULLING kernels on ``agent_id``."""
        return [
            k for k in session.kernels.values() if k.status is S.PULLING and k.agent_id == agent_id
        ]

    def image_there_on(self, session: Session, agent_id: str) -> bool:
        """The session's PULLING kernels on ``agent_id`` (one at least) all see its image there
        (``image_there_for``): they may be PREPARED."""
        waiting = self.pulling_there(session, agent_id)
        return bool(waiting) and all(self.image_there_for(k, session.image) for k in waiting)

    def unsettled_sessions(self) -> Iterable[str]:
        return [sid for sid, s in self.sessions.items() if not is_settled(s)]


def _room_of(state: AgentState | None) -> tuple[Any, ...] | None:
    """What never_holds reads of an agent."""
    if state is None:
        return None
    return (state.agent.capacity, state.agent.resource_group, state.live)


def _applied(aggregate: Any, event: ev.Event, rec: Recorded) -> Any:
    """``event`` (stored as ``rec``) folded into ``aggregate``; Inadmissible if it cannot be."""
    aggregate = fold(aggregate, event, rec.subject)
    passed(aggregate, rec.seq)
    return aggregate


def _loaded(session: Session | None) -> int:
    """The last sequence of its subject the cached session has applied (0: none cached)."""
    return 0 if session is None else loaded_seq(session)
