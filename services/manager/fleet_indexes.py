"""The indexes the scheduler and the reactors read without scanning the view.

Kept in line with every session as it changes (``reindex``): the room each agent's kernels hold
(AGENT_RESOURCE_OCCUPYING), what each owner's kernels are charged (USER_RESOURCE_OCCUPYING),
the pending queue, which sessions live or pull on which agent, when images were asked for, and
the interactive sessions by the time they started running.  Beside them, each agent's scheduler
view and the placement index built from those views, rebuilt only for the agents that changed.
"""

from __future__ import annotations

import bisect
import logging
from collections import defaultdict
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from datetime import datetime

from domain.events import ClusterMode, Resources
from domain.placement_index import AgentIndex
from domain.quota import Usage
from domain.scheduling import AgentView, IdleRoom, PendingSession, Policy
from domain.session import Session
from domain.status import (
    AGENT_RESOURCE_OCCUPYING,
    TERMINAL,
    USER_RESOURCE_OCCUPYING,
    KernelStatus,
)
from services.manager.agent_state import AgentState
from services.manager.reservations import Reservations

log = logging.getLogger(__name__)

S = KernelStatus


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


def _all_pending(session: Session) -> bool:
    """Whether every kernel of ``session`` is PENDING (it waits in the queue)."""
    return all(k.status is S.PENDING for k in session.kernels.values())


class FleetIndexes:
    """The scheduling indexes over the view's ``sessions`` and ``agents`` (shared, not copied)."""

    def __init__(
        self,
        sessions: dict[str, Session],
        agents: dict[str, AgentState],
        reservations: Reservations,
        freed: Callable[[], None],
        settled: Callable[[str], None],
    ) -> None:
        self.sessions = sessions
        self.agents = agents
        self.reservations = reservations  # every agent's: the other account of its room
        self._freed = freed  # room may have been freed: the scheduler may look again
        self._settled = settled  # a session became RUNNING or final
        self.kernel_session: dict[str, str] = {}
        self.pending: dict[str, int] = {}  # session id -> enqueue order
        self.owner_sessions: defaultdict[str, int] = defaultdict(int)
        # (owner, name) -> the sessions of that name that have not ended (`hoist run --name`):
        # one, but two managers creating one name at once may both have stored it
        self.session_names: dict[tuple[str, str], set[str]] = {}
        # owner -> what their kernels in USER_RESOURCE_OCCUPYING hold (quotas, domain.quota)
        self.owner_usage: defaultdict[str, Usage] = defaultdict(Usage)
        # interactive session id -> when it became RUNNING (max_lifetime_s, domain.quota), and
        # the same sorted by that time: the lifetime loop walks the oldest without sorting
        self.running_since: dict[str, datetime] = {}
        self.running_order: list[tuple[datetime, str]] = []
        self.live_on_agent: defaultdict[str, set[str]] = defaultdict(set)
        # Agents whose kernels, registration or liveness changed since reconciliation last
        # took them (services.manager.agent_sync visits only those and the ones that differed)
        self.changed_agents: set[str] = set()
        self.pulling_on_agent: defaultdict[str, set[str]] = defaultdict(set)
        # Per image: when a session last asked for it and when one first did (prepull rules).
        self.image_last_used: dict[str, datetime] = {}
        self.image_first_seen: dict[str, datetime] = {}
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

    def defer_until_caught_up(self) -> None:
        """The start-up fold begins: index its sessions once, at its end (index_deferred)."""
        self._unindexed = {}

    def take(self, session: Session) -> None:
        """A session the start-up fold changed: indexed now, or at the fold's end."""
        if self._unindexed is None:
            self.reindex(session)
        else:
            self.sessions[session.id] = session
            self._unindexed[session.id] = None
            self._queue(session.id, _all_pending(session))  # the queue keeps fold order

    def agent_changed(self, agent_id: str, room: bool) -> None:
        """An agent's kernels, registration or liveness changed (``room``: what never_holds
        reads of it too)."""
        self.changed_agents.add(agent_id)
        self._stale_views[agent_id] = None
        if room:
            self._idle_room.clear()

    def room_changed(self, agent_id: str, freed: bool) -> None:
        """An agent's reservations changed what it holds: its view is stale."""
        if agent_id in self.agents:
            self._stale_views[agent_id] = None
        if freed:
            self._freed()

    def index_deferred(self) -> None:
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
        self._set_name(session)
        self._set_footprint(sid, session.owner, new)
        if is_settled(session):
            self._settled(sid)

    def _set_name(self, session: Session, gone: bool = False) -> None:
        if session.name is None:
            return
        key = (session.owner, session.name)
        holders = self.session_names.setdefault(key, set())
        if not gone and session.status not in TERMINAL:
            holders.add(session.id)
        else:
            holders.discard(session.id)
        if not holders:
            del self.session_names[key]

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
        if freed:
            self._freed()

    def _set_running_since(self, sid: str, since: datetime | None) -> None:
        old = self.running_since.get(sid)
        if since == old:
            return
        if old is not None:
            del self.running_since[sid]
            at = bisect.bisect_left(self.running_order, (old, sid))
            del self.running_order[at]  # a move of pointers, not a sort
        if since is not None:
            self.running_since[sid] = since
            bisect.insort(self.running_order, (since, sid))

    def forget(self, session_id: str) -> None:
        """Drop a session the store does not have (a create whose append failed)."""
        session = self.sessions.pop(session_id, None)
        self._set_running_since(session_id, None)
        if session is not None:
            self._set_name(session, gone=True)
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
        hold): a scheduling pass does not rebuild every view for the one that changed."""
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

    def pending_sessions(self, held: Container[str]) -> list[PendingSession]:
        """Pending sessions nobody is changing right now (not in ``held``), in enqueue order."""
        out = []
        for sid in sorted(self.pending, key=self.pending.__getitem__):
            if sid in held:
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

    def sessions_on(self, agent_id: str) -> list[str]:
        return list(self.live_on_agent.get(agent_id, ()))
