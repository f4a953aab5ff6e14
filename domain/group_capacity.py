"""A resource group's live agents as they are when idle: could they ever hold a session, and
the words a session that finds no room keeps as its status_info."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime

from domain.events import ClusterMode, Resources
from domain.milli_units import SlotAsk, mc_down, mc_up, slot_ask, times
from domain.quota import fmt_amount, fmt_mem
from domain.scheduling_types import NO_INSTANCES, AgentView, PendingSession, single_block

_GROUPS_SHOWN = 8  # a reason stays one readable line

Shape = tuple[int, int, SlotAsk, int, bool]  # (cpu, mem, slots) per kernel, kernels, one block


def no_live_agents(group: str, live_groups: Collection[str]) -> str:
    """Why a group without a live agent places nothing, naming the groups that have one (a
    misspelt ``resource_group`` waits here: a stack's agents may still be starting)."""
    names = sorted(live_groups)
    where = ", ".join(repr(g) for g in names[:_GROUPS_SHOWN]) or "none yet"
    if len(names) > _GROUPS_SHOWN:
        where += f" and {len(names) - _GROUPS_SHOWN} more (hoist agents lists them)"
    return (
        f"{NO_INSTANCES}: resource group {group!r} has no live agents (resource groups with"
        f" live agents: {where})"
    )


def need(cpu: float, mem: int, slots: Mapping[str, float]) -> str:
    """'2.0 cpu and 4 GiB', or with slots '2.0 cpu, 4 GiB and gpu 2'."""
    if not slots:
        return f"{float(round(cpu, 6))} cpu and {fmt_mem(mem)}"
    items = [f"{float(round(cpu, 6))} cpu", fmt_mem(mem)]
    items += [f"{k} {fmt_amount(v)}" for k, v in sorted(slots.items()) if v > 0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def no_room_info(group: str, session: PendingSession, fitted: int) -> str:
    """Why a session that could fit the idle group finds no room now (``fitted`` of its
    kernels did, before they were taken back)."""
    r, n = session.resources, session.cluster_size
    if single_block(session):
        asked = need(r.cpu * n, r.mem * n, {k: v * n for k, v in r.slots.items()})
        return (
            f"{NO_INSTANCES}: no live agent in resource group {group!r} has {asked} free"
            f" for the {n} kernels of this single-node session"
        )
    asked = need(r.cpu, r.mem, r.slots)
    if n == 1:
        return f"{NO_INSTANCES}: no live agent in resource group {group!r} has {asked} free"
    return (
        f"{NO_INSTANCES}: live agents in resource group {group!r} have room for"
        f" {fitted} of {n} kernels of {asked} each"
    )


class GroupCapacity:
    """The capacities of one resource group's live agents, for the slots ``slot_names``."""

    def __init__(self, name: str, agents: Iterable[AgentView], slot_names: Collection[str]) -> None:
        self.name = name
        self.ids: list[str] = []
        self.cap_cpu: list[int] = []
        self.cap_mem: list[int] = []
        self.cap_slots: list[dict[str, int]] = []  # only the slots named
        for agent in agents:
            self.ids.append(agent.agent_id)
            self.cap_cpu.append(max(1, mc_down(agent.capacity.cpu)))
            self.cap_mem.append(max(1, agent.capacity.mem))
            self.cap_slots.append({k: mc_down(agent.capacity.slots.get(k, 0)) for k in slot_names})
        self.ever: dict[Shape, bool] = {}

    def could_ever_fit(self, session: PendingSession) -> bool:
        """Whether the group's live agents, idle, could hold the whole session."""
        cpu, mem, n = mc_up(session.resources.cpu), session.resources.mem, session.cluster_size
        return self._ever(cpu, mem, slot_ask(session.resources), n, single_block(session))

    def _ever(self, cpu: int, mem: int, slots: SlotAsk, n: int, single: bool) -> bool:
        shape = (cpu, mem, slots, n, single)
        if shape not in self.ever:
            if single:
                caps = zip(self.cap_cpu, self.cap_mem, self.cap_slots, strict=True)
                self.ever[shape] = any(
                    c >= cpu * n and m >= mem * n and all(s[k] >= a * n for k, a in slots)
                    for c, m, s in caps
                )
            else:
                self.ever[shape] = self._idle_room(cpu, mem, slots) >= n
        return self.ever[shape]

    def _idle_room(self, cpu: int, mem: int, slots: SlotAsk) -> int:
        """How many kernels of (cpu, mem, slots) the group's agents hold when idle."""
        cpu, mem = max(cpu, 1), max(mem, 1)
        if not slots:
            return sum(
                min(c // cpu, m // mem) for c, m in zip(self.cap_cpu, self.cap_mem, strict=True)
            )
        caps = zip(self.cap_cpu, self.cap_mem, self.cap_slots, strict=True)
        return sum(min(c // cpu, m // mem, *(s[k] // a for k, a in slots)) for c, m, s in caps)

    def never_info(self, session: PendingSession) -> str:
        """Why the group's live agents could not hold the session even when idle."""
        r, n = session.resources, session.cluster_size
        short = []  # slots no agent offers enough of for one kernel: the likeliest cause
        for k, a in slot_ask(r):
            most = max(c[k] for c in self.cap_slots)
            if most < a:
                have = f"the most is {fmt_amount(most / 1000)}" if most else f"none offers {k}"
                short.append(f"{k} {fmt_amount(r.slots[k])} per kernel ({have})")
        if short:
            return (
                f"{NO_INSTANCES}: no live agent of resource group {self.name!r} offers "
                + " nor ".join(short)
            )
        if single_block(session):
            total_slots = {k: v * n for k, v in r.slots.items()}
            asked = need(r.cpu * n, r.mem * n, total_slots)
            lacking = []  # the dimensions in which even the biggest agent is too small
            if max(self.cap_cpu) < mc_up(r.cpu) * n:
                lacking.append(f"{float(max(self.cap_cpu) / 1000)} cpu")
            if max(self.cap_mem) < r.mem * n:
                lacking.append(fmt_mem(max(self.cap_mem)))
            for k, a in times(slot_ask(r), n):
                most = max(c[k] for c in self.cap_slots)
                if most < a:
                    lacking.append(f"{k} {fmt_amount(most / 1000)}")
            have = (
                f"the most any live agent of resource group {self.name!r} has: {', '.join(lacking)}"
                if lacking
                else f"no live agent of resource group {self.name!r} has all of it at once"
            )
            return (
                f"{NO_INSTANCES}: single-node session needs {asked} on one agent"
                f" ({n} kernels); {have}"
            )
        return (
            f"{NO_INSTANCES}: the live agents of resource group {self.name!r} cannot hold"
            f" {n} kernel(s) of {need(r.cpu, r.mem, r.slots)} even when idle"
        )

    def refusal(self, session: PendingSession) -> tuple[str, str]:
        """(field, why) the group's live agents could not hold ``session`` even when idle,
        naming the largest agent in the dimension that falls short (see ``never_holds``)."""
        r, n = session.resources, session.cluster_size
        single = single_block(session)
        per = n if single else 1  # kernels one agent must hold at once
        whose = f"resource group {self.name!r}"
        asks: list[tuple[str, int, list[int]]] = [
            ("cpu", mc_up(r.cpu) * per, self.cap_cpu),
            ("mem", r.mem * per, self.cap_mem),
            *((k, a * per, [c[k] for c in self.cap_slots]) for k, a in slot_ask(r)),
        ]
        asked = f"the {n} kernels of this single-node session ask" if single else "asks"
        for key, amount, caps in asks:
            best = max(range(len(caps)), key=lambda i: (caps[i], -i))  # ties: the first id
            if caps[best] >= amount:
                continue
            if key == "mem":
                want, have = fmt_mem(amount), fmt_mem(caps[best])
            else:
                want = f"{fmt_amount(amount / 1000)} {key}"
                have = f"{fmt_amount(caps[best] / 1000)} {key}"
            if not caps[best]:
                return f"resources.{key}", (
                    f"{asked} {want} but no live agent of {whose} offers {key}"
                )
            return f"resources.{key}", (
                f"{asked} {want}{' on one agent' if single else ''} but the largest live agent"
                f" of {whose}, {self.ids[best]}, has {have}"
            )
        total = need(r.cpu * per, r.mem * per, {k: v * per for k, v in r.slots.items()})
        if single or not self._idle_room(mc_up(r.cpu), r.mem, slot_ask(r)):
            return "resources", f"{total}: no live agent of {whose} has all of it at once"
        room = self._idle_room(mc_up(r.cpu), r.mem, slot_ask(r))
        return "cluster_size", (
            f"{n} kernels of {total} each, but the live agents of {whose} hold {room} of them"
            " even when idle"
        )


def asked_slots(resources: Resources) -> frozenset[str]:
    """The slot names a request asks some of: what a ``GroupCapacity`` for it must keep."""
    return frozenset(k for k, v in resources.slots.items() if v > 0)


def never_holds(
    resources: Resources,
    cluster_size: int,
    cluster_mode: ClusterMode,
    resource_group: str,
    agents: Sequence[AgentView],
) -> tuple[str, str] | None:
    """(field, why) when the live agents of ``resource_group`` could not hold the session even
    when idle (the scheduler's own test, ``GroupCapacity.could_ever_fit``), so it could never
    start: multi-node, each kernel must fit an agent and all of them the group; single-node,
    all of them one agent.  None when they could, and when the group has no live agent at all
    (agents still starting: the session waits for them)."""
    return IdleRoom(resource_group, agents).never_holds(resources, cluster_size, cluster_mode)


class IdleRoom:
    """``never_holds`` for one resource group, answered from its live agents' capacities as
    they were when built: each slot set asked builds its view of the group once and each
    shape's answer is kept, so a create costs the same however many agents there are (the
    caller builds a new one when an agent's capacity, group or liveness changes)."""

    def __init__(self, resource_group: str, agents: Sequence[AgentView]) -> None:
        self.resource_group = resource_group
        self._agents = sorted(
            (a for a in agents if a.live and a.resource_group == resource_group),
            key=lambda a: a.agent_id,
        )
        self._groups: dict[frozenset[str], GroupCapacity] = {}  # by the slot names asked

    def never_holds(
        self, resources: Resources, cluster_size: int, cluster_mode: ClusterMode
    ) -> tuple[str, str] | None:
        if not self._agents:
            return None
        session = PendingSession(
            session_id="new",
            owner="",
            image="",
            resources=resources,
            cluster_size=cluster_size,
            resource_group=self.resource_group,
            kernel_ids=[str(i) for i in range(cluster_size)],
            enqueued_at=datetime.min,
            cluster_mode=cluster_mode,
        )
        slots = asked_slots(resources)
        group = self._groups.get(slots)
        if group is None:
            group = self._groups[slots] = GroupCapacity(self.resource_group, self._agents, slots)
        if group.could_ever_fit(session):  # memoized per shape (GroupCapacity.ever)
            return None
        return group.refusal(session)
