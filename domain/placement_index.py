"""The live agents kept sorted for the scheduler across plans, so a plan costs what is pending.

``plan`` (domain.scheduling) builds its view of the fleet for every call: every live agent of
a pending session's group is visited, scored and sorted, ~8 ms a pass at 1,000 agents when a
single session waits.  ``AgentIndex`` keeps that work between passes: each resource group's
live agents with room sit in lists sorted best first for the strategy (all of them, those
offering each slot, the holders of each image), and an agent whose view changed moves in
them (``put``, O(log n) plus a list insert).  ``plan_indexed`` then decides the pending
sessions exactly as ``plan`` does (same predicates, order, scores, ties and messages:
``decide_all`` is shared), walking the lists from the best agent down; what a plan reserves
is written into the lists and taken back when it ends, so the index always mirrors the views.

Only agents that could hold nothing (no cpu or no memory left; every request asks for some of
both, domain.limits) leave the lists; ``plan`` also drops those too full for the smallest
pending request, which changes nothing but the walk.  Capacity questions (could the group
ever hold this session, and why not) go to a ``_Group`` of the idle capacities, built again
only when an agent's capacity, group or liveness changes.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Mapping, Sequence

from domain.quota import Quota, Usage
from domain.scheduling import (
    AgentView,
    Limits,
    PendingSession,
    PlanStats,
    Policy,
    Scheduled,
    SlotAsk,
    Unschedulable,
    _check_unique,
    _Group,
    _mc_down,
    _mc_up,
    _single,
    _slot_ask,
    _times,
    decide_all,
    locality_bonus,
    no_live_agents,
)

Key = tuple[float, str, "_Agent"]  # (-score, agent_id, the agent): best first


class _Agent:
    """One live agent's room, in the integer units of a plan (domain.scheduling)."""

    __slots__ = ("cap_cpu", "cap_mem", "free_cpu", "free_mem", "free_slots", "key", "view")

    def __init__(self, view: AgentView) -> None:
        self.view = view
        self.cap_cpu = max(1, _mc_down(view.capacity.cpu))
        self.cap_mem = max(1, view.capacity.mem)
        self.free_cpu = self.cap_cpu - _mc_up(view.reserved_cpu)
        self.free_mem = self.cap_mem - view.reserved_mem
        # every slot offered or held: an agent that does not offer a slot has 0 of it
        free = {k: _mc_down(v) for k, v in view.capacity.slots.items()}
        for k, v in view.reserved_slots.items():
            free[k] = free.get(k, 0) - _mc_up(v)
        self.free_slots = free
        self.key: Key | None = None  # its entry in the lists, None while it has no room


class _IndexedGroup:
    """One resource group's live agents, sorted best first, kept between plans."""

    def __init__(self, name: str, policy: Policy, live_groups: Collection[str] = ()) -> None:
        self.name = name
        self.policy = policy
        self.live_groups = live_groups  # named when this one has no live agent
        self.concentrated = policy.strategy == "concentrated"
        self.agents: dict[str, _Agent] = {}
        self.order: list[Key] = []  # every agent with room
        self.slot_orders: dict[str, list[Key]] = {}  # slot -> those offering it
        self.holder_orders: dict[str, list[Key]] = {}  # image -> those holding it
        self.holders: dict[str, dict[str, int]] = {}  # image -> agent -> size (with room or not)
        self._held_size: dict[str, int] = {}  # image -> largest size a holder reports (cache)
        self._idle: dict[frozenset[str], _Group] = {}  # by slots asked: idle capacities
        self._never: dict[tuple[object, ...], str] = {}  # shape -> why it never fits
        # During a plan: each agent's room before the plan first took from it, and the shapes
        # that found no room (room only shrinks during a plan, so bigger ones find none).
        self._before: dict[str, tuple[int, int, dict[str, int]]] = {}
        self._no_room: list[tuple[int, int, SlotAsk]] = []
        self._bonuses: dict[str, float] = {}
        self._image_sizes: Mapping[str, int] = {}
        self.examined = 0

    # -- keeping it current ----------------------------------------------------------------

    def put(self, view: AgentView) -> None:
        old = self.agents.get(view.agent_id)
        if old is not None:
            self._drop(old)
        a = self.agents[view.agent_id] = _Agent(view)
        for image, size in view.images.items():
            self.holders.setdefault(image, {})[view.agent_id] = size
            self._held_size.pop(image, None)
        if old is None or _capacity(old.view) != _capacity(view):
            self._idle.clear()
            self._never.clear()
        self._index(a)

    def remove(self, agent_id: str) -> None:
        a = self.agents.pop(agent_id)
        self._drop(a)
        self._idle.clear()
        self._never.clear()

    def _drop(self, a: _Agent) -> None:
        self._unindex(a)
        for image in a.view.images:
            held = self.holders[image]
            del held[a.view.agent_id]
            if not held:
                del self.holders[image]
            self._held_size.pop(image, None)

    def _lists(self, a: _Agent) -> list[list[Key]]:
        lists = [self.order]
        for k, v in a.view.capacity.slots.items():
            if _mc_down(v) > 0:
                lists.append(self.slot_orders.setdefault(k, []))
        for image in a.view.images:
            lists.append(self.holder_orders.setdefault(image, []))
        return lists

    def _index(self, a: _Agent) -> None:
        if a.free_cpu < 1 or a.free_mem < 1:
            return  # no request fits (cpu and mem are > 0)
        used = (1 - a.free_cpu / a.cap_cpu + 1 - a.free_mem / a.cap_mem) / 2
        score = used if self.concentrated else 1 - used
        a.key = (-score, a.view.agent_id, a)
        for order in self._lists(a):
            bisect.insort(order, a.key)

    def _unindex(self, a: _Agent) -> None:
        key = a.key
        if key is None:
            return
        for order in self._lists(a):
            del order[bisect.bisect_left(order, key[:2])]
        a.key = None

    # -- a plan ------------------------------------------------------------------------------

    def begin(self, image_sizes: Mapping[str, int]) -> None:
        self._image_sizes = image_sizes
        self._bonuses = {}
        self._no_room = []
        self.examined = 0

    def end(self) -> None:
        """Give back what the plan took: the lists mirror the views again."""
        for agent_id, (cpu, mem, slots) in self._before.items():
            a = self.agents[agent_id]
            self._unindex(a)
            a.free_cpu, a.free_mem, a.free_slots = cpu, mem, slots
            self._index(a)
        self._before.clear()

    def _take(self, a: _Agent, cpu: int, mem: int, slots: SlotAsk) -> None:
        if a.view.agent_id not in self._before:
            self._before[a.view.agent_id] = (a.free_cpu, a.free_mem, dict(a.free_slots))
        self._unindex(a)
        a.free_cpu -= cpu
        a.free_mem -= mem
        free = a.free_slots
        for k, n in slots:
            free[k] = free.get(k, 0) - n
        self._index(a)

    def _bonus(self, image: str) -> float:
        bonus = self._bonuses.get(image)
        if bonus is None:
            held = self.holders.get(image, {})
            size = self._image_sizes.get(image)
            if size is None:
                size = self._held_size.get(image)
                if size is None:
                    size = self._held_size[image] = max(held.values(), default=0)
            weight = self.policy.locality_weight if self.policy.image_locality else 0.0
            bonus = self._bonuses[image] = locality_bonus(size, len(held), len(self.agents), weight)
        return bonus

    def _first_fit(self, order: list[Key], cpu: int, mem: int, slots: SlotAsk) -> Key | None:
        """The best-scoring entry of ``order`` with room for (cpu, mem, slots)."""
        if not slots:
            for seen, key in enumerate(order, 1):
                a = key[2]
                if a.free_cpu >= cpu and a.free_mem >= mem:
                    self.examined += seen
                    return key
        else:
            for seen, key in enumerate(order, 1):
                a = key[2]
                if (
                    a.free_cpu >= cpu
                    and a.free_mem >= mem
                    and all(a.free_slots.get(k, 0) >= n for k, n in slots)
                ):
                    self.examined += seen
                    return key
        self.examined += len(order)
        return None

    def _pick(self, cpu: int, mem: int, slots: SlotAsk, image: str) -> _Agent | None:
        """As ``_Group._pick``: the best score with room, a holder of the image by its bonus."""
        slot = slots[0][0] if slots else None
        best = self._first_fit(
            self.order if slot is None else self.slot_orders.get(slot, []), cpu, mem, slots
        )
        if best is None:
            return None
        bonus = self._bonus(image)
        if not bonus or image in best[2].view.images:
            return best[2]
        holder = self._first_fit(self.holder_orders.get(image, []), cpu, mem, slots)
        if holder is not None and (holder[0] - bonus, holder[1]) < best[:2]:
            return holder[2]
        return best[2]

    def _known_no_room(self, cpu: int, mem: int, slots: SlotAsk) -> bool:
        asked = dict(slots)
        return any(
            c <= cpu and m <= mem and all(asked.get(k, 0) >= n for k, n in s)
            for c, m, s in self._no_room
        )

    def idle(self, session: PendingSession) -> _Group:
        """The group's idle capacities for the slots ``session`` asks (kept until one changes)."""
        names = frozenset(k for k, v in session.resources.slots.items() if v > 0)
        group = self._idle.get(names)
        if group is None:
            group = self._idle[names] = _Group(self.name, self.policy)
            group.note_request(session)  # the slot names its capacities keep
            for agent_id in sorted(self.agents):
                group.add_agent(self.agents[agent_id].view)
        return group

    def could_ever_fit(self, session: PendingSession) -> bool:
        return self.idle(session).could_ever_fit(session)

    def place(self, session: PendingSession) -> tuple[dict[str, str] | None, str]:
        """As ``_Group.place``: placements for every kernel, or None and why not."""
        if not self.agents:
            return None, no_live_agents(self.name, self.live_groups)
        n, single = session.cluster_size, _single(session)
        cpu, mem = _mc_up(session.resources.cpu), session.resources.mem
        slots = _slot_ask(session.resources)
        idle = self.idle(session)
        if not idle.could_ever_fit(session):
            r = session.resources
            shape = (r.cpu, r.mem, tuple(sorted(r.slots.items())), n, single)
            if shape not in self._never:
                self._never[shape] = idle._never_info(session)
            return None, self._never[shape]
        if single:
            cpu, mem, slots = cpu * n, mem * n, _times(slots, n)
        if self._known_no_room(cpu, mem, slots):
            return None, idle._no_room_info(session, 0)
        if single:
            a = self._pick(cpu, mem, slots, session.image)
            if a is None:
                self._no_room.append((cpu, mem, slots))
                return None, idle._no_room_info(session, 0)
            self._take(a, cpu, mem, slots)
            return {k: a.view.agent_id for k in session.kernel_ids}, ""
        taken: list[_Agent] = []
        for _ in session.kernel_ids:
            a = self._pick(cpu, mem, slots, session.image)
            if a is None:
                break
            self._take(a, cpu, mem, slots)
            taken.append(a)
        if len(taken) == n:
            return {k: a.view.agent_id for k, a in zip(session.kernel_ids, taken, strict=True)}, ""
        back = _times(slots, -1)
        for a in taken:  # all-or-nothing
            self._take(a, -cpu, -mem, back)
        if not taken:
            self._no_room.append((cpu, mem, slots))
        return None, idle._no_room_info(session, len(taken))


def _capacity(view: AgentView) -> tuple[object, ...]:
    """What the idle-capacity answers read of an agent."""
    return (view.capacity.cpu, view.capacity.mem, view.capacity.slots)


class AgentIndex:
    """Every live agent by resource group, sorted for ``policy``'s strategy; ``put`` each view
    that changed, ``remove`` each agent gone (a view that is not live is removed)."""

    def __init__(self, policy: Policy, agents: Sequence[AgentView] = ()) -> None:
        self.policy = policy
        self.groups: dict[str, _IndexedGroup] = {}
        self._group_of: dict[str, str] = {}  # agent id -> its group, while live
        self.totals: dict[str, int] = {"cpu": 0, "mem": 0}  # live_totals, kept
        _check_unique("agents", [a.agent_id for a in agents])
        for view in agents:
            self.put(view)

    def put(self, view: AgentView) -> None:
        group = self._group_of.get(view.agent_id)
        if group is not None:
            if not view.live or group != view.resource_group:
                self.remove(view.agent_id)
            else:
                self._count(self.groups[group].agents[view.agent_id].view, -1)
        if not view.live:
            return
        name = view.resource_group
        if name not in self.groups:
            self.groups[name] = _IndexedGroup(name, self.policy)
        self.groups[name].put(view)
        self._group_of[view.agent_id] = name
        self._count(view, 1)

    def remove(self, agent_id: str) -> None:
        name = self._group_of.pop(agent_id, None)
        if name is None:
            return
        group = self.groups[name]
        self._count(group.agents[agent_id].view, -1)
        group.remove(agent_id)
        if not group.agents:
            del self.groups[name]

    def _count(self, view: AgentView, sign: int) -> None:
        t = self.totals
        t["cpu"] += sign * _mc_down(view.capacity.cpu)
        t["mem"] += sign * view.capacity.mem
        for k, v in view.capacity.slots.items():
            t[k] = t.get(k, 0) + sign * _mc_down(v)

    def group(self, name: str) -> _IndexedGroup:
        """The group's agents (an empty one, not kept, when it has no live agent)."""
        return self.groups.get(name) or _IndexedGroup(name, self.policy, tuple(self.groups))


def plan_indexed(
    pending: Sequence[PendingSession],
    index: AgentIndex,
    owner_sessions: Mapping[str, int],
    limits: Limits,
    image_sizes: Mapping[str, int] = {},  # read only
    stats: PlanStats | None = None,
    *,
    quotas: Mapping[str, Quota] = {},  # read only
    usage: Mapping[str, Usage] = {},  # read only
) -> list[Scheduled | Unschedulable]:
    """``plan(pending, the index's agents, ..., index.policy, ...)``, visiting only the agents
    the pending sessions' picks walk past; the index is as it was when this returns."""
    _check_unique("pending", [s.session_id for s in pending])
    queue = sorted(pending, key=lambda s: (s.enqueued_at, s.session_id))
    used: dict[str, _IndexedGroup] = {}
    for session in queue:
        if session.resource_group not in used:
            used[session.resource_group] = index.group(session.resource_group)
            used[session.resource_group].begin(image_sizes)
    try:
        return decide_all(
            queue,
            used.__getitem__,
            index.totals,
            owner_sessions,
            limits,
            index.policy,
            quotas,
            usage,
        )
    finally:
        for group in used.values():
            group.end()
            if stats is not None:
                stats.agents_examined += group.examined
