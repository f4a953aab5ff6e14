"""The manager's in-memory view: every agent and session as the event log says, kept current.

Built by folding the whole log on start, then every new event as it is stored (one ordered
consumer); nothing here is state the log cannot rebuild.  Beside the aggregates it keeps the
indexes the reactors need without scanning: free room per agent (kernels in
AGENT_RESOURCE_OCCUPYING), occupying sessions per owner (USER_RESOURCE_OCCUPYING), the pending
queue, and which sessions have live kernels on which agent.

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
import bisect
import contextlib
import copy
import logging
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from domain import events as ev
from domain.admission import Inadmissible, admit, binding, fold
from domain.agent import Agent
from domain.errors import DomainError
from domain.events import ClusterMode, Resources
from domain.image_ref import canonical_or_same
from domain.liveness import AgentLiveness, is_lost
from domain.placement_index import AgentIndex
from domain.prepull import PrepullPolicy
from domain.quota import ResourcePolicy, Usage
from domain.reservation import AgentReservations
from domain.resource_group import ResourceGroup
from domain.rpc import RequestError
from domain.scheduling import AgentView, IdleRoom, PendingSession, Policy
from domain.session import Session, sent_back
from domain.status import (
    AGENT_RESOURCE_OCCUPYING,
    TERMINAL,
    USER_RESOURCE_OCCUPYING,
    Kernel,
    KernelStatus,
)
from domain.subjects import LEASE, LIVENESS, RESERVATION, RESOURCE_GROUP, RESOURCE_POLICY, USER
from domain.user import User
from eventstore.bulk import BULK_MIN, BulkReader
from eventstore.quarantine import quarantined
from eventstore.repository import NotFound, Repository, loaded_seq, passed
from eventstore.store import ConcurrencyError, EventStore, Recorded, StoreError, Write
from services.manager.bus import LookAgain, RoomFreed
from services.manager.requester import requester
from services.manager.reservations import Reservations
from transport.tasks import Tasks

log = logging.getLogger(__name__)

S = KernelStatus
FOLLOW_RETRY_S = 0.5  # the first pause before following the log again after a failed read
FOLLOW_RETRY_MAX_S = 10.0


@dataclass
class AgentState:
    """One agent: its aggregate and the room its kernels hold."""

    agent: Agent
    reserved_cpu: float = 0.0
    reserved_mem: int = 0
    reserved_slots: dict[str, float] = field(default_factory=dict)  # e.g. gpu held
    # image -> (task id, reason) of its last failed pull, until a new pull starts or succeeds
    failed_pulls: dict[str, tuple[str, str]] = field(default_factory=dict)
    # image -> task id of its last finished pull (what a kernel sent back for its image waits
    # for: the image in ``agent.images`` may be the stale one it was sent back from)
    pulled: dict[str, str] = field(default_factory=dict)
    registered_seq: int = 0  # stream sequence of its latest (re)registration
    liveness: AgentLiveness | None = None  # its losses (the manager's subject)

    @property
    def live(self) -> bool:
        lost_seq = 0 if self.liveness is None else loaded_seq(self.liveness)
        return not is_lost(self.registered_seq, lost_seq)

    @property
    def status_info(self) -> str:
        """Why it is lost, or how it last registered."""
        if not self.live and self.liveness is not None:
            return self.liveness.status_info
        return self.agent.status_info

    @property
    def lost_at(self) -> datetime | None:
        return None if self.live or self.liveness is None else self.liveness.lost_at


@dataclass
class _Footprint:
    """What one session contributes to the indexes (to subtract when it changes)."""

    agents: dict[str, tuple[float, int]]  # agent id -> cpu, mem held there
    owner_active: bool
    pending: bool
    live_on: frozenset[str]  # agents with a non-terminal kernel of this session
    pulling_on: frozenset[str]
    slots: dict[str, dict[str, float]] = field(default_factory=dict)  # agent -> slot -> held
    # What its owner's quota is charged (kernels in USER_RESOURCE_OCCUPYING): cpu, mem, slots
    charged: tuple[float, int, dict[str, float]] = (0.0, 0, {})


_EMPTY = _Footprint({}, False, False, frozenset(), frozenset())


def is_settled(session: Session) -> bool:
    """RUNNING or final: what a create with max_wait waits for."""
    return session.status == S.RUNNING or session.status in TERMINAL


class Fleet:
    def __init__(
        self,
        store: EventStore,
        repository: Repository,
        publish: Callable[[object], None] = lambda message: None,
        bulk: BulkReader | None = None,
    ) -> None:
        self.store = store
        # Reads a long start-up fold in a child process (eventstore.bulk): parsing
        # 150,000 records took a third of a 10 s fold on the manager's loop.
        self.bulk = bulk
        # Where what the fold learns goes once caught up (services.manager.bus): agent,
        # liveness and policy events as folded, RoomFreed, LookAgain.
        self.publish = publish
        self.repository = repository
        self.agents: dict[str, AgentState] = {}
        self.sessions: dict[str, Session] = {}
        self.kernel_session: dict[str, str] = {}
        self.pending: dict[str, int] = {}  # session id -> enqueue order
        self.owner_sessions: defaultdict[str, int] = defaultdict(int)
        # owner -> what their kernels in USER_RESOURCE_OCCUPYING hold (quotas, domain.quota)
        self.owner_usage: defaultdict[str, Usage] = defaultdict(Usage)
        self.resource_policies: dict[str, ResourcePolicy] = {}  # removed ones too
        # group -> who may use it, as an admin defined it (removed ones too; domain.resource_group)
        self.resource_groups: dict[str, ResourceGroup] = {}
        self.users: dict[str, User] = {}  # Hoist users (domain.user), disabled ones too
        # interactive session id -> when it became RUNNING (max_lifetime_s, domain.quota), and
        # the same sorted by that time: the lifetime loop walks the oldest without sorting
        self.running_since: dict[str, datetime] = {}
        self.running_order: list[tuple[datetime, str]] = []
        self.live_on_agent: defaultdict[str, set[str]] = defaultdict(set)
        # Agents whose kernels, registration or liveness changed since reconciliation last
        # took them (services.manager.agent_sync visits only those and the ones that differed)
        self.changed_agents: set[str] = set()
        self.pulling_on_agent: defaultdict[str, set[str]] = defaultdict(set)
        self.last_seq = 0  # the last stream sequence folded
        self.conflicts = 0  # session saves the store refused on its expected sequence (metrics)
        self.policies: dict[str, PrepullPolicy] = {}  # prepull policies, removed ones too
        # The aggregates an admin sets through the manager, by subject kind: folded, and saved
        # by ``save_admin``, one way.
        self._admin: dict[str, dict[str, Any]] = {
            "prepull-policy": self.policies,
            RESOURCE_POLICY: self.resource_policies,
            RESOURCE_GROUP: self.resource_groups,
            USER: self.users,
        }
        self.liveness: dict[str, AgentLiveness] = {}  # agent id -> its losses
        # Per image: when a session last asked for it and when one first did (prepull rules).
        self.image_last_used: dict[str, datetime] = {}
        self.image_first_seen: dict[str, datetime] = {}
        self.caught_up = asyncio.Event()
        # image -> its size in bytes as an agent last reported it (locality weighs bytes)
        self.image_sizes: dict[str, int] = {}
        # kernel id -> the pull it waits for when that is no longer the one its KernelPulling
        # named (the agent restarted and check-and-pull started another; check-pulling-kernels)
        self.pull_retasked: dict[str, str] = {}
        self._footprints: dict[str, _Footprint] = {}
        # While the start-up fold runs: sessions whose indexes are brought in line once at its
        # end (a session's six records were six reindexes); None: at every record.
        self._unindexed: dict[str, None] | None = None
        # agent id -> its scheduler view, and the agents whose view must be built again
        self._views: dict[str, AgentView] = {}
        self._stale_views: dict[str, None] = {}  # ordered: a new agent's view goes last
        self._index: AgentIndex | None = None  # the scheduler's, once it asked (agent_index)
        # group -> never_holds over its live agents' capacities; dropped when one changes
        self._idle_room: dict[str, IdleRoom] = {}
        self._order = 0
        self._held: dict[str, asyncio.Event] = {}  # session locks
        self._seen: dict[str, int] = {}  # highest seq seen per session subject while locked
        # Cached sessions that hold a change the log may not have (its append failed and so did
        # the reload): the next lock reloads them first, and a task keeps trying meanwhile.
        self._stale: set[str] = set()
        self._waiters: defaultdict[str, list[asyncio.Future[None]]] = defaultdict(list)
        self._tasks = Tasks()  # the log follower and reloads
        # every agent's reservations (domain.reservation): the other account of its room
        self.reservations = Reservations(repository, self.sessions.get, self._room_changed)

    # -- following the log ---------------------------------------------------------------

    async def start(self) -> None:
        """Fold the log up to its current end, then keep following it."""
        info = await self.store.js.stream_info(self.store.stream)
        target = info.state.last_seq
        if target == 0:
            self.caught_up.set()
        else:  # indexes and surpluses counted once the fold is done (_follow_log)
            self._unindexed = {}
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
                    self._index_unindexed()
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
                self._fold_admin(self._admin[kind], aggregate_id, rec, event)
        except Inadmissible as e:
            quarantined(rec.seq, rec.subject, rec.headers, e.reason, "manager")

    def _fold_admin(self, table: dict[str, Any], name: str, rec: Recorded, event: ev.Event) -> None:
        aggregate = table.get(name)
        if aggregate is not None and rec.seq <= loaded_seq(aggregate):
            return  # our own write, kept by save_admin
        table[name] = _applied(aggregate, event, rec)
        if self.caught_up.is_set():
            self.publish(event)

    async def change_admin(
        self, aggregate: Any, kind: str, what: str, change: Callable[[Any], None]
    ) -> Any:
        """``change`` a copy of a folded admin-set ``aggregate`` (the folded one stays as the
        log has it until the save lands) and save it; a change its aggregate refuses is a
        ``conflict`` naming ``name``.  The saved copy."""
        changed = copy.deepcopy(aggregate)
        try:
            change(changed)
        except DomainError as e:
            raise RequestError("conflict", f"name: {e}") from None
        await self.save_admin(changed, kind, what)
        return changed

    async def save_admin(self, aggregate: Any, kind: str, what: str) -> None:
        """Save an aggregate an admin set (over hoist.admin) and publish its events; another
        writer meanwhile is a ``conflict`` the admin sends again (``what``: its name there)."""
        events = list(aggregate.pending_events)
        try:
            # A fresh key makes the append idempotent, so the store sends it again while a
            # cluster elects a new stream leader (a node's loss) instead of failing the admin.
            key = uuid.uuid4().hex
            await self.repository.save(aggregate, request_id=key, actor=requester("admin"))
        except ConcurrencyError:
            raise RequestError(
                "conflict", f"name: {what} {aggregate.id!r} changed meanwhile; send it again"
            ) from None
        self._admin[kind][aggregate.id] = aggregate
        for event in events:
            self.publish(event)

    def agent_groups(self) -> set[str]:
        """The resource groups some registered agent (live or not) joined."""
        return {s.agent.resource_group for s in self.agents.values()}

    def _room_changed(self, agent_id: str, freed: bool) -> None:
        """An agent's reservations changed what it holds: its view is stale."""
        if agent_id in self.agents:
            self._stale_views[agent_id] = None
        if freed and self.caught_up.is_set():
            self.publish(RoomFreed())

    def _fold_liveness(self, agent_id: str, rec: Recorded, event: ev.Event) -> None:
        liveness = _applied(self.liveness.get(agent_id), event, rec)
        self.liveness[agent_id] = liveness
        state = self.agents.get(agent_id)
        if state is None:
            return  # lost before it registered: nothing to mark (never recorded by Hoist)
        state.liveness = liveness
        self.changed_agents.add(agent_id)
        self._stale_views[agent_id] = None
        self._idle_room.clear()
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
            if self._unindexed is None:
                self.reindex(session)
            else:
                self.sessions[session_id] = session
                self._unindexed[session_id] = None
                self._queue(session_id, _all_pending(session))  # the queue keeps fold order
            return
        # Someone else wrote this session (another manager, or a write of ours that landed
        # after its timeout).  Nobody here holds it: the view has every earlier record of its
        # subject (the log comes in order), so the record applies as the next one; one that
        # does not apply makes it reload.  Held: our write's ack may not be back yet, so the
        # lock holder checks on release.
        if session_id not in self._held and session_id not in self._stale:
            try:
                session = _applied(session, event, rec)
            except Inadmissible:
                pass
            else:
                self.reindex(session)
                self.publish(LookAgain(session_id))
                return
        self._seen[session_id] = max(seq, self._seen.get(session_id, 0))
        if session_id not in self._held:
            self._tasks.spawn(self._reload_locked(session_id), f"reload {session_id}")

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
        self.changed_agents.add(agent_id)
        self._stale_views[agent_id] = None
        if _room_of(state) != before:
            self._idle_room.clear()
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

    # -- indexes -------------------------------------------------------------------------

    def _index_unindexed(self) -> None:
        """Index every session the start-up fold deferred; index at every record again."""
        unindexed, self._unindexed = self._unindexed or {}, None
        for sid in unindexed:
            try:
                self.reindex(self.sessions[sid])
            except Exception:  # as _take does: one session's failure is not the fold's
                log.exception("session %s not indexed", sid)

    def _queue(self, sid: str, pending: bool) -> None:
        """Keep the pending queue: a session joins its end when it becomes pending."""
        if pending and sid not in self.pending:
            self._order += 1
            self.pending[sid] = self._order
        elif not pending:
            self.pending.pop(sid, None)

    def reindex(self, session: Session) -> None:
        """Bring the indexes in line with ``session`` as it is now."""
        sid = session.id
        held: dict[str, tuple[float, int]] = {}
        slots: dict[str, dict[str, float]] = {}
        asked_slots = session.resources.slots
        live_on: set[str] = set()
        pulling_on: set[str] = set()
        owner_active = False
        charged_cpu, charged_mem, charged_n = 0.0, 0, 0
        for k in session.kernels.values():
            self.kernel_session[k.kernel_id] = sid
            st = k.status
            if st is not S.PENDING and st not in TERMINAL:
                # A session counts for its owner's session limits from SCHEDULED until it
                # ends, PULLING too: a pull holds no cpu, mem or slot, but it is a
                # session, so sessions still pulling cannot each start past the quota.
                owner_active = True
            if st in USER_RESOURCE_OCCUPYING:
                charged_cpu += session.resources.cpu
                charged_mem += session.resources.mem
                charged_n += 1
            if k.agent_id is None:
                continue
            if st in AGENT_RESOURCE_OCCUPYING:
                cpu, mem = held.get(k.agent_id, (0.0, 0))
                held[k.agent_id] = (cpu + session.resources.cpu, mem + session.resources.mem)
                if asked_slots:
                    on_agent = slots.setdefault(k.agent_id, {})
                    for name, amount in asked_slots.items():
                        on_agent[name] = on_agent.get(name, 0.0) + amount
            if st not in TERMINAL:
                live_on.add(k.agent_id)
            if st is S.PULLING:
                pulling_on.add(k.agent_id)
        charged_slots = {k: v * charged_n for k, v in asked_slots.items() if v > 0 and charged_n}
        new = _Footprint(
            held,
            owner_active,
            _all_pending(session),
            frozenset(live_on),
            frozenset(pulling_on),
            slots,
            (round(charged_cpu, 9), charged_mem, charged_slots),
        )
        first = next(iter(session.kernels.values()), None)
        if first is not None and first.status_history:
            at = first.status_history[0].at  # enqueued
            image = session.image
            if at > self.image_last_used.get(image, at) or image not in self.image_last_used:
                self.image_last_used[image] = at
            if at < self.image_first_seen.get(image, at) or image not in self.image_first_seen:
                self.image_first_seen[image] = at
        since = session.running_since() if session.session_type == "interactive" else None
        self._set_running_since(sid, since)
        self.sessions[sid] = session
        self._set_footprint(sid, session.owner, new)
        if is_settled(session):
            for fut in self._waiters.pop(sid, ()):
                if not fut.done():
                    fut.set_result(None)

    def _set_footprint(self, sid: str, owner: str, new: _Footprint) -> None:
        old = self._footprints.get(sid, _EMPTY)
        self._footprints[sid] = new
        held = self.reservations.by_agent
        for agent_id in old.agents.keys() | new.agents.keys() | old.live_on | new.live_on:
            if agent_id in held:
                self.reservations.recount(agent_id, (sid,))
        freed = False
        for agent_id in old.agents.keys() | new.agents.keys():
            ocpu, omem = old.agents.get(agent_id, (0.0, 0))
            ncpu, nmem = new.agents.get(agent_id, (0.0, 0))
            if (ocpu, omem) == (ncpu, nmem):
                continue
            state = self.agents.get(agent_id)
            if state is not None:
                self._stale_views[agent_id] = None
                # Rounded: sums of 0.1 cores would otherwise leave 1e-14 reserved on an idle agent.
                state.reserved_cpu = max(0.0, round(state.reserved_cpu + ncpu - ocpu, 9))
                state.reserved_mem = max(0, state.reserved_mem + nmem - omem)
            freed = freed or ncpu < ocpu or nmem < omem
        for agent_id in old.slots.keys() | new.slots.keys():
            state = self.agents.get(agent_id)
            oslots, nslots = old.slots.get(agent_id, {}), new.slots.get(agent_id, {})
            if state is None or oslots == nslots:
                continue
            self._stale_views[agent_id] = None
            for name in oslots.keys() | nslots.keys():
                delta = nslots.get(name, 0.0) - oslots.get(name, 0.0)
                held_now = round(state.reserved_slots.get(name, 0.0) + delta, 9)
                if held_now > 0:
                    state.reserved_slots[name] = held_now
                else:
                    state.reserved_slots.pop(name, None)
                freed = freed or delta < 0
        if old.owner_active != new.owner_active:
            self.owner_sessions[owner] += 1 if new.owner_active else -1
            freed = freed or not new.owner_active  # a per-owner limit may let one through now
        if old.charged != new.charged or old.owner_active != new.owner_active:
            (ocpu, omem, oslots), (ncpu, nmem, nslots) = old.charged, new.charged
            usage = self.owner_usage[owner]
            usage.add(
                ncpu - ocpu,
                nmem - omem,
                {k: nslots.get(k, 0.0) - oslots.get(k, 0.0) for k in oslots.keys() | nslots.keys()},
                int(new.owner_active) - int(old.owner_active),
            )
            if usage.empty:
                del self.owner_usage[owner]
            # a quota may let one through now (a kernel went PULLING or stopped)
            freed = (
                freed
                or ncpu < ocpu
                or nmem < omem
                or any(nslots.get(k, 0.0) < v for k, v in oslots.items())
            )
        self._queue(sid, new.pending)
        self.changed_agents.update(old.live_on, new.live_on)
        for agent_id in old.live_on - new.live_on:
            self.live_on_agent[agent_id].discard(sid)
        for agent_id in new.live_on - old.live_on:
            self.live_on_agent[agent_id].add(sid)
        for agent_id in old.pulling_on - new.pulling_on:
            self.pulling_on_agent[agent_id].discard(sid)
        for agent_id in new.pulling_on - old.pulling_on:
            self.pulling_on_agent[agent_id].add(sid)
        if freed and self.caught_up.is_set():
            self.publish(RoomFreed())

    def _set_running_since(self, sid: str, since: datetime | None) -> None:
        old = self.running_since.get(sid)
        if since == old:
            return
        if old is not None:
            del self.running_since[sid]
            at = bisect.bisect_left(self.running_order, (old, sid))
            del self.running_order[at]  # a move of pointers: ~10 us at 20,000 running
        if since is not None:
            self.running_since[sid] = since
            bisect.insort(self.running_order, (since, sid))

    def _forget(self, session_id: str) -> None:
        """Drop a session the store does not have (a create whose append failed)."""
        session = self.sessions.pop(session_id, None)
        self._set_running_since(session_id, None)
        if session is not None:
            self._set_footprint(session_id, session.owner, _EMPTY)
            self._footprints.pop(session_id, None)

    # -- views for the scheduler ---------------------------------------------------------

    def never_holds(
        self,
        resources: Resources,
        cluster_size: int,
        cluster_mode: ClusterMode,
        resource_group: str,
    ) -> tuple[str, str] | None:
        """domain.scheduling.never_holds over the live agents, without visiting them per
        create: each group's IdleRoom is kept until an agent's capacity, group or liveness
        changes."""
        room = self._idle_room.get(resource_group)
        if room is None:
            room = self._idle_room[resource_group] = IdleRoom(resource_group, self.agent_views())
        return room.never_holds(resources, cluster_size, cluster_mode)

    def agent_views(self) -> list[AgentView]:
        """Every agent as the scheduler sees it, in registration order. Each view is kept and
        built again only when its agent changed (an event, its liveness, the room its kernels
        hold): a scheduling pass does not rebuild 1,000 views for the one that changed."""
        self._refresh_views()
        return list(self._views.values())

    def agent_index(self, policy: Policy) -> AgentIndex:
        """The live agents sorted for ``policy`` (domain.placement_index), kept between
        scheduling passes: only the agents whose view changed since the last call move."""
        self._refresh_views()
        if self._index is None or self._index.policy != policy:
            self._index = AgentIndex(policy, list(self._views.values()))
        return self._index

    def _refresh_views(self) -> None:
        for agent_id in self._stale_views:
            view = self.view_of(agent_id)
            if self._index is not None and view != self._views.get(agent_id):
                self._index.put(view)
            self._views[agent_id] = view
        self._stale_views.clear()

    def view_of(self, agent_id: str) -> AgentView:
        """One agent's view, built from its state now."""
        s = self.agents[agent_id]
        # What the sessions hold there, and what its reservations hold beyond that.
        cpu, mem, slots = self.reservations.extra(agent_id)
        reserved_slots = dict(s.reserved_slots)
        for name, amount in slots.items():
            reserved_slots[name] = round(reserved_slots.get(name, 0.0) + amount, 9)
        return AgentView(
            agent_id=agent_id,
            resource_group=s.agent.resource_group,
            capacity=s.agent.capacity,
            reserved_cpu=round(s.reserved_cpu + cpu, 9),
            reserved_mem=s.reserved_mem + mem,
            reserved_slots=reserved_slots,
            images={image: held.size_bytes for image, held in s.agent.images.items()},
            live=s.live,
        )

    def pending_sessions(self) -> list[PendingSession]:
        """Pending sessions nobody is changing right now, in enqueue order."""
        out = []
        for sid in sorted(self.pending, key=self.pending.__getitem__):
            if sid in self._held:
                continue
            s = self.sessions[sid]
            kernels = list(s.kernels.values())
            out.append(
                PendingSession(
                    session_id=sid,
                    owner=s.owner,
                    image=s.image,
                    resources=s.resources,
                    cluster_size=len(kernels),
                    resource_group=s.resource_group,
                    kernel_ids=[k.kernel_id for k in kernels],
                    enqueued_at=kernels[0].status_history[0].at,
                    cluster_mode=s.cluster_mode,
                )
            )
        return out

    def image_there_for(self, kernel: Kernel, image: str) -> bool:
        """The view shows ``kernel``'s agent holding ``image``, for this kernel: one a create
        sent back for its image (``image-missing``) waits until the view has seen the pull it
        waits for finish, as the image the view shows may be the one that was gone."""
        state = self.agents.get(kernel.agent_id or "")
        if state is None or image not in state.agent.images:
            return False
        return not sent_back(kernel) or state.pulled.get(image) in self.pull_tasks_of(kernel)

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

    def pull_tasks_of(self, kernel: Kernel) -> set[str]:
        """The pulls a PULLING kernel may be waiting for: the one its KernelPulling named, and
        the one check-and-pull started instead after its agent restarted."""
        tasks = {kernel.pull_task_id, self.pull_retasked.get(kernel.kernel_id)}
        tasks.discard(None)
        return tasks  # type: ignore[return-value]

    def retasked(self, kernel_id: str, task_id: str | None) -> None:
        """The kernel now waits for pull ``task_id`` (None: no other than its own)."""
        if task_id is None:
            self.pull_retasked.pop(kernel_id, None)
        else:
            self.pull_retasked[kernel_id] = task_id

    def sessions_on(self, agent_id: str) -> list[str]:
        return list(self.live_on_agent.get(agent_id, ()))

    def unsettled_sessions(self) -> Iterable[str]:
        return [sid for sid, s in self.sessions.items() if not is_settled(s)]

    # -- changing sessions ---------------------------------------------------------------

    def try_lock(self, session_id: str) -> bool:
        if session_id in self._held or session_id in self._stale:
            return False
        self._held[session_id] = asyncio.Event()
        return True

    async def lock(self, session_id: str) -> None:
        while (held := self._held.get(session_id)) is not None:
            await held.wait()
        self._held[session_id] = asyncio.Event()
        if session_id in self._stale:
            try:
                await self.reload(session_id)
            except BaseException:
                self._held.pop(session_id).set()
                raise
            self._stale.discard(session_id)

    def release_now(self, session_id: str) -> None:
        """Release a lock taken with try_lock under which nothing was recorded."""
        self._held.pop(session_id).set()
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
            self._held.pop(session_id).set()

    async def committed(self, session_id: str) -> Session | None:
        """The session as the log has it. A change applies its events to the cached session
        before they are saved, so a reader waits out a change in flight: no reply ever shows
        a status the log might never get (a crash before the append)."""
        while (held := self._held.get(session_id)) is not None:
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
        self.reindex(session)
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
                self.reindex(session)
        return stored

    async def reload_or_mark_stale(self, session_id: str) -> None:
        """Drop what the cached session holds beyond the log: reload it; if the store does not
        answer, mark it stale (the next lock reloads it, a task keeps trying) and raise."""
        try:
            await self.reload(session_id)
        except StoreError:
            self.mark_stale(session_id)
            raise

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

    async def reload(self, session_id: str) -> None:
        try:
            session = await self.repository.get(Session, session_id)
        except NotFound:
            self._forget(session_id)
            return
        self.reindex(session)
        self.publish(LookAgain(session_id))

    async def _reload_locked(self, session_id: str) -> None:
        async with self.locked(session_id) as session:
            if session is None or self._seen.get(session_id, 0) > loaded_seq(session):
                self._seen.pop(session_id, None)
                await self.reload(session_id)

    # -- waiting -------------------------------------------------------------------------

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


def _all_pending(session: Session) -> bool:
    """Whether every kernel of ``session`` is PENDING (it waits in the queue)."""
    return all(k.status is S.PENDING for k in session.kernels.values())


def _loaded(session: Session | None) -> int:
    """The last sequence of its subject the cached session has applied (0: none cached)."""
    return 0 if session is None else loaded_seq(session)
