"""The live agents kept sorted for the scheduler, between plans and within one.

Each resource group's live agents with room sit in lists sorted best first for the strategy
(all of them, those offering each slot, the holders of each image), and an agent whose view
changed moves in them (``put``, O(log n) plus a list insert), so a plan walks them from the
best agent down and costs what is pending, not the size of the fleet.  What a plan reserves is
written into the lists and taken back when it ends (``begin`` / ``end``), so a kept index
always mirrors the views.

Only agents that could hold nothing (no cpu or no memory left; every request asks for some of
both, domain.limits) leave the lists.  Capacity questions (could the group ever hold this
session, and why not) go to a ``GroupCapacity`` of the idle capacities, built again only when
an agent's capacity, group or liveness changes.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Mapping, Sequence

from domain.group_capacity import GroupCapacity, asked_slots, no_live_agents, no_room_info
from domain.milli_units import SlotAsk, mc_down, mc_up, slot_ask, times
from domain.scheduling_types import (
    AgentView,
    PendingSession,
    Policy,
    check_unique,
    locality_bonus,
    single_block,
)

Key = tuple[float, str, "_Agent"]  # (-score, agent_id, the agent): best first


class _Agent:
    """One live agent's room, in the integer units of a plan (domain.scheduling)."""

    __slots__ = ("cap_cpu", "cap_mem", "free_cpu", "free_mem", "free_slots", "key", "view")

    def __init__(self, view: AgentView) -> None:
        self.view = view
        self.cap_cpu = max(1, mc_down(view.capacity.cpu))
        self.cap_mem = max(1, view.capacity.mem)
        self.free_cpu = self.cap_cpu - mc_up(view.reserved_cpu)
        self.free_mem = self.cap_mem - view.reserved_mem
        # every slot offered or held: an agent that does not offer a slot has 0 of it
        free = {k: mc_down(v) for k, v in view.capacity.slots.items()}
        for k, v in view.reserved_slots.items():
            free[k] = free.get(k, 0) - mc_up(v)
        self.free_slots = free
        self.key: Key | None = None  # its entry in the lists, None while it has no room


class GroupIndex:
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
        self._idle: dict[frozenset[str], GroupCapacity] = {}  # by slots asked: idle capacities
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

    def load(self, views: Iterable[AgentView]) -> None:
        """``put`` views of agents the group does not hold yet, sorting each list once at the
        end rather than inserting agent by agent (the same lists: the keys are unique)."""
        for view in views:
            a = self.agents[view.agent_id] = _Agent(view)
            for image, size in view.images.items():
                self.holders.setdefault(image, {})[view.agent_id] = size
            key = self._keyed(a)
            if key is not None:
                for order in self._lists(a):
                    order.append(key)
        self._held_size.clear()
        self._idle.clear()
        self._never.clear()
        for order in (self.order, *self.slot_orders.values(), *self.holder_orders.values()):
            order.sort()

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
            if mc_down(v) > 0:
                lists.append(self.slot_orders.setdefault(k, []))
        for image in a.view.images:
            lists.append(self.holder_orders.setdefault(image, []))
        return lists

    def _keyed(self, a: _Agent) -> Key | None:
        """Give ``a`` its entry at its current score; None when no request fits it."""
        if a.free_cpu < 1 or a.free_mem < 1:
            return None  # every request asks for some cpu and some memory
        used = (1 - a.free_cpu / a.cap_cpu + 1 - a.free_mem / a.cap_mem) / 2
        score = used if self.concentrated else 1 - used
        a.key = (-score, a.view.agent_id, a)
        return a.key

    def _index(self, a: _Agent) -> None:
        key = self._keyed(a)
        if key is not None:
            for order in self._lists(a):
                bisect.insort(order, key)

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
        """The agent with room for (cpu, mem, slots) and the highest score, plus the image's
        locality bonus if it holds the image; ties to the smaller agent_id."""
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

    def idle(self, session: PendingSession) -> GroupCapacity:
        """The group's idle capacities for the slots ``session`` asks (kept until one changes)."""
        names = asked_slots(session.resources)
        group = self._idle.get(names)
        if group is None:
            views = [self.agents[agent_id].view for agent_id in sorted(self.agents)]
            group = self._idle[names] = GroupCapacity(self.name, views, names)
        return group

    def could_ever_fit(self, session: PendingSession) -> bool:
        return self.idle(session).could_ever_fit(session)

    def place(self, session: PendingSession) -> tuple[dict[str, str] | None, str]:
        """Placements for every kernel, or None and the status_info saying what was needed.
        A session is placed all-or-nothing: the kernels placed before one that finds no room
        are taken back."""
        if not self.agents:
            return None, no_live_agents(self.name, self.live_groups)
        n, single = session.cluster_size, single_block(session)
        cpu, mem = mc_up(session.resources.cpu), session.resources.mem
        slots = slot_ask(session.resources)
        idle = self.idle(session)
        if not idle.could_ever_fit(session):
            r = session.resources
            shape = (r.cpu, r.mem, tuple(sorted(r.slots.items())), n, single)
            if shape not in self._never:
                self._never[shape] = idle.never_info(session)
            return None, self._never[shape]
        if single:
            cpu, mem, slots = cpu * n, mem * n, times(slots, n)
        if self._known_no_room(cpu, mem, slots):
            return None, no_room_info(self.name, session, 0)
        if single:
            a = self._pick(cpu, mem, slots, session.image)
            if a is None:
                self._no_room.append((cpu, mem, slots))
                return None, no_room_info(self.name, session, 0)
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
        back = times(slots, -1)
        for a in taken:  # all-or-nothing
            self._take(a, -cpu, -mem, back)
        if not taken:
            self._no_room.append((cpu, mem, slots))
        return None, no_room_info(self.name, session, len(taken))


def _capacity(view: AgentView) -> tuple[object, ...]:
    """What the idle-capacity answers read of an agent."""
    return (view.capacity.cpu, view.capacity.mem, view.capacity.slots)


class AgentIndex:
    """Every live agent by resource group, sorted for ``policy``'s strategy; ``put`` each view
    that changed, ``remove`` each agent gone (a view that is not live is removed)."""

    def __init__(self, policy: Policy, agents: Sequence[AgentView] = ()) -> None:
        self.policy = policy
        self.groups: dict[str, GroupIndex] = {}
        self._group_of: dict[str, str] = {}  # agent id -> its group, while live
        # what the live agents offer together (milli-cpu, bytes, milli-slots): drf's denominator
        self.totals: dict[str, int] = {"cpu": 0, "mem": 0}
        check_unique("agents", [a.agent_id for a in agents])
        by_group: dict[str, list[AgentView]] = {}
        for view in agents:
            if view.live:
                by_group.setdefault(view.resource_group, []).append(view)
                self._group_of[view.agent_id] = view.resource_group
                self._count(view, 1)
        for name, views in by_group.items():
            self.groups[name] = GroupIndex(name, self.policy)
            self.groups[name].load(views)

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
            self.groups[name] = GroupIndex(name, self.policy)
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
        t["cpu"] += sign * mc_down(view.capacity.cpu)
        t["mem"] += sign * view.capacity.mem
        for k, v in view.capacity.slots.items():
            t[k] = t.get(k, 0) + sign * mc_down(v)

    def group(self, name: str) -> GroupIndex:
        """The group's agents (an empty one, not kept, when it has no live agent)."""
        return self.groups.get(name) or GroupIndex(name, self.policy, tuple(self.groups))
