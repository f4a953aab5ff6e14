"""The scheduling policy: which pending sessions start now, and on which agents.

``plan`` is pure: given the pending sessions, the agents as the manager sees them this moment,
the per-owner session counts, the limits and the policy, it decides every session once —
``Scheduled`` with a placement for each kernel, or ``Unschedulable`` with the status_info the
session keeps while it stays PENDING (seed 004: ``predicate-checks-failed: ...``,
``no-available-instances: ...``).

How it decides, per session in FIFO order (enqueued_at, then session_id):
1. Predicates (per-owner concurrent sessions, per-session cpu / mem totals, cluster size, and
   the owner's resource policy: ``user cpu quota (3.0 of 4.0 used, asks 2.0)``, see
   domain.quota).  Every failing one is named with its numbers; a predicate failure never
   blocks the queue.
2. Placement among the live agents of the session's resource group that have room now:
   free = capacity - reserved - what this plan already placed there, for cpu, mem and every
   resource slot the kernel asks for (``gpu``: an agent that does not offer a slot has 0 of
   it), so two sessions never share free capacity and no agent is over-committed.
   ``multi-node`` sessions are placed kernel by kernel (several may share an agent);
   ``single-node`` ones as one block of cluster_size x resources on one agent. A session is
   placed all-or-nothing: if one kernel finds no room, the kernels placed before it are
   taken back.
3. With ``fifo_strict`` the first session of a resource group that does not fit (but would
   on idle agents) holds back every later session of that group, as Backend.AI's FIFO
   scheduler does; otherwise later, smaller sessions go ahead of it.

The order (``Policy.order``): ``"fifo"`` decides the sessions in enqueue order. ``"drf"``
(dominant resource fairness, as Backend.AI's DRF scheduler) decides next the oldest session of
the owner whose dominant share is the smallest, so one owner's thousand pending sessions do not
starve another owner's one:
- an owner's dominant share = max over resources (cpu, mem, and every slot the live fleet
  offers) of (what the owner holds now, ``usage``, + what this plan already placed for them)
  / (the total capacity of that resource over all live agents, every resource group);
- the whole live fleet is the denominator because ``usage`` is per owner across resource
  groups (what USER_RESOURCE_OCCUPYING kernels hold, wherever they are), so a share per
  resource group cannot be told from it; a resource no live agent offers does not count;
  like the quotas, the share does not count kernels that are PULLING (not in ``usage``);
- ties go to the owner whose next session was enqueued first; one owner's sessions are decided
  in FIFO order; a session that is not placed leaves its owner's share as it was;
- with ``fifo_strict``, "first" means first in that order: the smallest-share owner's session
  that does not fit (but would on idle agents) holds back the rest of its resource group, so a
  big session of the owner furthest below their share is not starved by smaller ones of owners
  above theirs (nor, as in FIFO, by sessions enqueued later);
- predicates, quotas, placement and all-or-nothing are the same as with FIFO: only the order
  in which sessions are decided changes.
The shares live in a heap with one entry per owner that has sessions left: each pick and each
update is O(log owners), on top of the same sort by enqueue order.

Scores (strategy and locality) count cpu and mem only: slots constrain where a kernel fits
but do not weigh in, so a cpu-only session may land on a gpu agent when it has the best score
(nothing keeps gpu agents free for gpu sessions).

Cost: each group keeps its agents sorted by strategy score, the agents offering each asked
slot in a list of their own, and the holders of each image that earns a locality bonus (per
slot a request routes by) in lists of their own; picking an agent takes the first fit of the
request's list (all agents, or those offering its first slot) and of the holders' list and
compares the two, and agents too full for the smallest pending request (in cpu, mem, and any
slot every pending request asks for) leave the lists. A request shape (cpu, mem, slots) that
found no room is remembered so bigger ones fail without a walk.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Literal, Protocol

import msgspec

from domain.errors import InvalidField
from domain.events import Capacity, ClusterMode, Resources
from domain.quota import Quota, Usage, fmt_amount, fmt_mem, quota_failures, totals
from domain.reasons import Reason

# Kubernetes ImageLocality's thresholds: below MIN the image is cheap to pull (no bonus);
# at MAX and above (size x spread) the bonus is full.
LOCALITY_MIN_BYTES = 23 * 2**20
LOCALITY_MAX_BYTES = 1000 * 2**20

PREDICATE_FAILED = Reason.PREDICATE_CHECKS_FAILED
Key = tuple[float, str, int]  # an agent's place in a best-first list: (-score, agent_id, index)
SlotAsk = tuple[tuple[str, int], ...]  # (slot, milli-units) asked, amount > 0, sorted by slot
Route = tuple[str, str | None]  # (image, first slot asked or None): which holders' list to walk
NO_INSTANCES = Reason.NO_AVAILABLE_INSTANCES


_GROUPS_SHOWN = 8  # a reason stays one readable line


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


class AgentView(msgspec.Struct, frozen=True, kw_only=True):
    """The scheduler's view of one agent at this moment."""

    agent_id: str
    resource_group: str  # only sessions of this group may land here
    capacity: Capacity  # what the agent offers in total (disk is not scheduled on)
    reserved_cpu: float  # cores held by its kernels in AGENT_RESOURCE_OCCUPYING statuses
    reserved_mem: int  # bytes held by those kernels
    images: dict[str, int]  # image -> size in bytes, images the agent holds now
    live: bool  # heartbeating and not lost; a dead agent gets nothing
    # slot -> amount held by its kernels in AGENT_RESOURCE_OCCUPYING statuses (its capacity
    # offers capacity.slots)
    reserved_slots: dict[str, float] = {}


class PendingSession(msgspec.Struct, frozen=True, kw_only=True):
    """A session whose kernels are all PENDING."""

    session_id: str
    owner: str  # the per-owner session limit counts by this
    image: str
    resources: Resources  # per kernel
    cluster_size: int  # number of kernels, each asking for ``resources``
    resource_group: str  # agents of this group only
    kernel_ids: list[str]  # cluster_size distinct ids; the keys of Scheduled.placements
    enqueued_at: datetime  # FIFO order (ties: session_id)
    # "single-node": every kernel on one agent; "multi-node": wherever each kernel has room
    cluster_mode: ClusterMode = "multi-node"

    def __post_init__(self) -> None:
        if self.cluster_mode not in ("single-node", "multi-node"):
            raise InvalidField(
                "cluster_mode",
                f"must be 'single-node' or 'multi-node', got {self.cluster_mode!r}",
            )
        if self.cluster_size < 1:
            raise InvalidField("cluster_size", f"must be at least 1, got {self.cluster_size}")
        if len(self.kernel_ids) != self.cluster_size or len(set(self.kernel_ids)) != len(
            self.kernel_ids
        ):
            raise InvalidField(
                "kernel_ids",
                f"session {self.session_id} needs {self.cluster_size} distinct kernel ids"
                f" (cluster_size), got {self.kernel_ids!r}",
            )


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Predicates; None means unlimited (no per-session limit on slots yet)."""

    max_sessions_per_owner: int | None = None  # concurrent non-terminal sessions (SCHEDULED on)
    max_cpu_per_session: float | None = None  # cores, all kernels of the session together
    max_mem_per_session: int | None = None  # bytes, all kernels of the session together
    max_cluster_size: int | None = None  # kernels in one session


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    """How agents are chosen among those with room."""

    # "concentrated": fullest agent that fits (fewest agents used); "dispersed": emptiest.
    strategy: Literal["concentrated", "dispersed"] = "dispersed"
    image_locality: bool = True  # prefer agents that already hold the image
    # True: the first session of a resource group that does not fit blocks the later ones
    # (Backend.AI FIFO, no starvation of big sessions); False: skip it and continue.
    fifo_strict: bool = False
    # The largest locality bonus, in utilization units (0..1): a holder of a big, widespread
    # image wins over a non-holder unless it is this much busier (0.25 = 25 points).
    locality_weight: float = 0.25
    # The order sessions are decided in: "fifo" (enqueue order) or "drf" (the owner with the
    # smallest dominant share first, ties and each owner's own sessions by enqueue order).
    order: Literal["fifo", "drf"] = "fifo"

    def __post_init__(self) -> None:
        if self.strategy not in ("concentrated", "dispersed"):
            raise InvalidField(
                "strategy", f"must be 'concentrated' or 'dispersed', got {self.strategy!r}"
            )
        if self.order not in ("fifo", "drf"):
            raise InvalidField("order", f"must be 'fifo' or 'drf', got {self.order!r}")
        if not 0 <= self.locality_weight <= 1:
            raise InvalidField(
                "locality_weight", f"must be between 0 and 1, got {self.locality_weight}"
            )


class Scheduled(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    placements: dict[str, str]  # kernel id -> agent id, every kernel of the session


class Unschedulable(msgspec.Struct, frozen=True, kw_only=True):
    session_id: str
    status_info: str  # "predicate-checks-failed: ..." or "no-available-instances: ..."


class PlanStats(msgspec.Struct, kw_only=True):
    """Work counters, filled by ``plan`` when given (for tests and benchmarks)."""

    agents_examined: int = 0  # agent entries looked at while choosing agents


def locality_bonus(size: int, holders: int, agents: int, weight: float) -> float:
    """The score bonus of an agent that holds an image (Kubernetes ImageLocality).

    bonus = weight * clamp((size * holders / agents - MIN) / (MAX - MIN), 0, 1)

    ``size``: bigger images weigh more — avoiding a 5 GB pull is worth a busier agent, a 5 MB
    pull is not (below 23 MiB the bonus is 0). ``holders / agents`` (the spread): an image on
    few agents earns a smaller bonus, so sessions do not pile onto the few agents that have it
    while the rest sit idle. The bonus is added to the strategy score (utilization in 0..1),
    so it decides among agents of similar load and loses once the holders are ``bonus`` busier
    (dispersed) or once they are full.
    """
    if size <= 0 or holders <= 0 or agents <= 0 or weight <= 0:
        return 0.0
    spread = size * holders / agents
    return weight * min(
        1.0, max(0.0, (spread - LOCALITY_MIN_BYTES) / (LOCALITY_MAX_BYTES - LOCALITY_MIN_BYTES))
    )


def plan(
    pending: Sequence[PendingSession],
    agents: Sequence[AgentView],
    owner_sessions: Mapping[str, int],
    limits: Limits,
    policy: Policy,
    image_sizes: Mapping[str, int] = {},  # read only, never mutated
    stats: PlanStats | None = None,
    *,
    quotas: Mapping[str, Quota] = {},  # read only
    usage: Mapping[str, Usage] = {},  # read only (copied for the owners it charges)
) -> list[Scheduled | Unschedulable]:
    """Decide every pending session, in FIFO order (enqueued_at, session_id), or with
    ``policy.order == "drf"`` the smallest dominant share's owner first (module docstring).

    ``owner_sessions``: owner -> their sessions already SCHEDULED or later and not terminal.
    ``image_sizes``: image -> size in bytes when known (e.g. from the registry); otherwise the
    size an agent holding it reports.  ``quotas``: owner -> their effective resource policy
    (an owner not named has none); ``usage``: owner -> what their kernels in
    USER_RESOURCE_OCCUPYING hold now (domain.quota).  Sessions placed earlier in this plan count
    against their owner's quota and session limit (and their dominant share with drf, where
    ``usage`` is what they hold now).  The result has one entry per pending session, in the
    order they were decided.
    """
    _check_unique("agents", [a.agent_id for a in agents])
    _check_unique("pending", [s.session_id for s in pending])
    queue = sorted(pending, key=lambda s: (s.enqueued_at, s.session_id))
    groups: dict[str, _Group] = {}
    live_groups = {a.resource_group for a in agents if a.live}
    for session in queue:
        if session.resource_group not in groups:
            groups[session.resource_group] = _Group(session.resource_group, policy, live_groups)
        groups[session.resource_group].note_request(session)
    for agent in sorted(agents, key=lambda a: a.agent_id):
        group = groups.get(agent.resource_group)
        if agent.live and group is not None:
            group.add_agent(agent)
    for group in groups.values():
        group.start(image_sizes)
    fleet_total = live_totals(agents) if policy.order == "drf" else {}
    out = decide_all(
        queue, groups.__getitem__, fleet_total, owner_sessions, limits, policy, quotas, usage
    )
    if stats is not None:
        stats.agents_examined += sum(g.examined for g in groups.values())
    return out


class Placer(Protocol):
    """One resource group's agents during a plan (``_Group``, or an index's group)."""

    def place(self, session: PendingSession) -> tuple[dict[str, str] | None, str]: ...

    def could_ever_fit(self, session: PendingSession) -> bool: ...


def live_totals(agents: Iterable[AgentView]) -> dict[str, int]:
    """What the live agents offer together (milli-cpu, bytes, milli-slots): drf's denominator.
    Integers, so the shares do not depend on the order agents are given in."""
    total: dict[str, int] = {"cpu": 0, "mem": 0}
    for a in agents:
        if a.live:
            total["cpu"] += _mc_down(a.capacity.cpu)
            total["mem"] += a.capacity.mem
            for k, v in a.capacity.slots.items():
                total[k] = total.get(k, 0) + _mc_down(v)
    return total


def decide_all(
    queue: Sequence[PendingSession],
    group_of: Callable[[str], Placer],
    fleet_total: Mapping[str, int],
    owner_sessions: Mapping[str, int],
    limits: Limits,
    policy: Policy,
    quotas: Mapping[str, Quota],
    usage: Mapping[str, Usage],
) -> list[Scheduled | Unschedulable]:
    """Decide every session of ``queue`` (sorted FIFO) in the policy's order, placing each
    through the ``Placer`` of its resource group (``fleet_total``: ``live_totals``, for drf)."""
    owners = dict(owner_sessions)
    blocked_by: dict[str, str] = {}  # resource group -> the session holding it (fifo_strict)
    out: list[Scheduled | Unschedulable] = []
    used: dict[str, Usage] = {}  # owners charged in this plan: their usage so far

    def decide(session: PendingSession) -> bool:
        """Decide one session into ``out``; whether it was placed."""
        failures = _predicate_failures(session, owners, limits)
        quota = quotas.get(session.owner)
        if quota is not None:
            now = used.get(session.owner) or usage.get(session.owner) or Usage()
            failures += quota_failures(quota, now, session.resources, session.cluster_size)
        if failures:
            info = f"{PREDICATE_FAILED}: " + "; ".join(failures)
            out.append(Unschedulable(session_id=session.session_id, status_info=info))
            return False
        group = group_of(session.resource_group)
        head = blocked_by.get(session.resource_group)
        if head is not None:
            info = (
                f"{NO_INSTANCES}: queued behind session {head!r}"
                f" (strict FIFO in resource group {session.resource_group!r})"
            )
            out.append(Unschedulable(session_id=session.session_id, status_info=info))
            return False
        placements, info = group.place(session)
        if placements is None:
            if policy.fifo_strict and group.could_ever_fit(session):
                blocked_by[session.resource_group] = session.session_id
            out.append(Unschedulable(session_id=session.session_id, status_info=info))
            return False
        owners[session.owner] = owners.get(session.owner, 0) + 1
        if quota is not None:
            if session.owner not in used:
                used[session.owner] = (usage.get(session.owner) or Usage()).copy()
            cpu, mem, slots = totals(session.resources, session.cluster_size)
            used[session.owner].add(cpu, mem, slots, 1)
        out.append(Scheduled(session_id=session.session_id, placements=placements))
        return True

    if policy.order == "drf":
        shares = _DominantShares(queue, fleet_total, usage)
        while (session := shares.next()) is not None:
            shares.decided(session, decide(session))
    else:
        for session in queue:
            decide(session)
    return out


class _DominantShares:
    """The drf order: each owner's sessions left, FIFO, and a heap of (dominant share, the
    place in the FIFO queue of the owner's next session), one entry per owner with sessions
    left."""

    def __init__(
        self,
        queue: Sequence[PendingSession],
        total: Mapping[str, int],
        usage: Mapping[str, Usage],
    ) -> None:
        self.total = {r: t for r, t in total.items() if t > 0}  # what no live agent offers: out
        self.queue = queue
        self.left: dict[str, deque[int]] = {}  # owner -> places in the queue, FIFO
        for i, session in enumerate(queue):
            self.left.setdefault(session.owner, deque()).append(i)
        self.held: dict[str, dict[str, int]] = {}
        self.heap: list[tuple[float, int]] = []
        for owner, sessions in self.left.items():
            u = usage.get(owner)
            held = {r: 0 for r in self.total}
            if u is not None:
                now = {"cpu": _mc_up(u.cpu), "mem": u.mem}
                now.update((k, _mc_up(v)) for k, v in u.slots.items())
                held = {r: now.get(r, 0) for r in self.total}
            self.held[owner] = held
            self.heap.append((self._share(held), sessions[0]))
        heapq.heapify(self.heap)

    def _share(self, held: Mapping[str, int]) -> float:
        return max((held[r] / t for r, t in self.total.items()), default=0.0)

    def next(self) -> PendingSession | None:
        """The next session to decide (the smallest share's owner's oldest), None when all are.
        The owner's entry stays at the top until ``decided`` replaces or drops it."""
        if not self.heap:
            return None
        return self.queue[self.heap[0][1]]

    def decided(self, session: PendingSession, placed: bool) -> None:
        """Charge a placed session to its owner's share; put the owner back if they have more."""
        owner = session.owner
        sessions = self.left[owner]
        sessions.popleft()
        share = self.heap[0][0]
        if placed:  # only the resources it asked for change, and only upwards
            held, total, n, asked = self.held[owner], self.total, session.cluster_size, []
            if "cpu" in held:
                asked.append(("cpu", _mc_up(session.resources.cpu) * n))
            if "mem" in held:
                asked.append(("mem", session.resources.mem * n))
            if session.resources.slots:
                asked += [(k, a * n) for k, a in _slot_ask(session.resources) if k in held]
            for r, amount in asked:
                held[r] += amount
                if held[r] / total[r] > share:
                    share = held[r] / total[r]
        if sessions:
            heapq.heapreplace(self.heap, (share, sessions[0]))
        else:
            heapq.heappop(self.heap)


def _check_unique(field: str, ids: list[str]) -> None:
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        raise InvalidField(field, f"ids must be unique; repeated: {dupes}")


def _predicate_failures(
    session: PendingSession, owners: Mapping[str, int], limits: Limits
) -> list[str]:
    """Each predicate of ``limits`` that fails, with its numbers (empty when all pass)."""
    failures = []
    n = session.cluster_size
    active = owners.get(session.owner, 0)
    if limits.max_sessions_per_owner is not None and active >= limits.max_sessions_per_owner:
        failures.append(
            f"max_sessions_per_owner ({active} running, limit {limits.max_sessions_per_owner})"
        )
    cpu = session.resources.cpu * n
    if limits.max_cpu_per_session is not None and cpu > limits.max_cpu_per_session + 1e-9:
        failures.append(
            f"max_cpu_per_session ({cpu:g} cpu asked, limit {limits.max_cpu_per_session:g})"
        )
    mem = session.resources.mem * n
    if limits.max_mem_per_session is not None and mem > limits.max_mem_per_session:
        failures.append(
            f"max_mem_per_session ({fmt_mem(mem)} asked,"
            f" limit {fmt_mem(limits.max_mem_per_session)})"
        )
    if limits.max_cluster_size is not None and n > limits.max_cluster_size:
        failures.append(f"max_cluster_size ({n} kernels asked, limit {limits.max_cluster_size})")
    return failures


# CPU and slots are counted in integer milli-units inside a plan so sums are exact: requests
# and reservations round up, capacity rounds down (never over-commit by a rounding error).
def _mc_up(cores: float) -> int:
    return max(0, math.ceil(round(cores * 1000, 6)))


def _mc_down(cores: float) -> int:
    return max(0, math.floor(round(cores * 1000, 6)))


def _need(cpu: float, mem: int, slots: Mapping[str, float]) -> str:
    """'2.0 cpu and 4 GiB', or with slots '2.0 cpu, 4 GiB and gpu 2'."""
    if not slots:
        return f"{float(round(cpu, 6))} cpu and {fmt_mem(mem)}"
    items = [f"{float(round(cpu, 6))} cpu", fmt_mem(mem)]
    items += [f"{k} {fmt_amount(v)}" for k, v in sorted(slots.items()) if v > 0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def _slot_ask(resources: Resources) -> SlotAsk:
    if not resources.slots:
        return ()
    return tuple(sorted((k, _mc_up(v)) for k, v in resources.slots.items() if v > 0))


def _times(ask: SlotAsk, n: int) -> SlotAsk:
    return tuple((k, a * n) for k, a in ask)


class _Group:
    """One resource group's live agents and their free room during a plan."""

    def __init__(self, name: str, policy: Policy, live_groups: Collection[str] = ()) -> None:
        self.name = name
        self.live_groups = live_groups  # named when this one has no live agent
        self.concentrated = policy.strategy == "concentrated"
        self.locality_weight = policy.locality_weight if policy.image_locality else 0.0
        self.ids: list[str] = []
        self.cap_cpu: list[int] = []
        self.cap_mem: list[int] = []
        self.cap_slots: list[dict[str, int]] = []  # only the slots pending sessions ask for
        self.free_cpu: list[int] = []
        self.free_mem: list[int] = []
        self.free_slots: list[dict[str, int]] = []
        self.holders: dict[str, set[int]] = {}  # image -> indices of agents holding it
        self.held_size: dict[str, int] = {}  # image -> largest size an agent reports
        # The smallest pending request: agents below it leave the lists. min_slots keeps only
        # the slots every pending request asks for (a cpu-only request asks 0 of every slot).
        self.min_cpu = math.inf
        self.min_mem = math.inf
        self.min_slots: dict[str, int] | None = None  # None until the first request
        self.slot_names: set[str] = set()  # the slots pending sessions ask for
        self.routes: set[Route] = set()  # (image, first slot) of pending requests
        # Agents best first, as (-score, agent_id, index): `order` holds all of them,
        # `slot_orders[slot]` those offering a slot, and `holder_orders[(image, slot)]` the
        # holders of an image that earns a locality bonus (offering the slot, if not None).
        self.order: list[Key] = []
        self.slot_orders: dict[str, list[Key]] = {}
        self.holder_orders: dict[Route, list[Key]] = {}
        self.lists_of: list[list[list[Key]]] = []  # the lists each agent is in
        self.keys: list[Key | None] = []  # each agent's current entry (None: too full)
        # Shapes (one kernel, or a single-node session's block) that found no room anywhere;
        # free room only shrinks during a plan, so any shape at least as big has none either.
        self.no_room: list[tuple[int, int]] = []
        self.no_room_slots: list[tuple[int, int, dict[str, int]]] = []
        self.bonuses: dict[str, float] = {}
        self.ever: dict[tuple[int, int, SlotAsk, int, bool], bool] = {}
        self.examined = 0

    def note_request(self, session: PendingSession) -> None:
        self.min_cpu = min(self.min_cpu, _mc_up(session.resources.cpu))
        self.min_mem = min(self.min_mem, session.resources.mem)
        if not session.resources.slots:  # the common case: no slot is asked by every request
            self.min_slots = {}
            self.routes.add((session.image, None))
            return
        ask = dict(_slot_ask(session.resources))
        if self.min_slots is None:
            self.min_slots = ask
        elif self.min_slots:
            self.min_slots = {k: min(a, ask[k]) for k, a in self.min_slots.items() if k in ask}
        self.slot_names.update(ask)
        self.routes.add((session.image, min(ask) if ask else None))

    def add_agent(self, agent: AgentView) -> None:
        i = len(self.ids)
        self.ids.append(agent.agent_id)
        self.cap_cpu.append(max(1, _mc_down(agent.capacity.cpu)))
        self.cap_mem.append(max(1, agent.capacity.mem))
        self.free_cpu.append(self.cap_cpu[i] - _mc_up(agent.reserved_cpu))
        self.free_mem.append(self.cap_mem[i] - agent.reserved_mem)
        caps = {k: _mc_down(agent.capacity.slots.get(k, 0)) for k in self.slot_names}
        self.cap_slots.append(caps)
        self.free_slots.append(
            {k: c - _mc_up(agent.reserved_slots.get(k, 0)) for k, c in caps.items()}
        )
        self.keys.append(None)
        self.lists_of.append([self.order])
        for image, size in agent.images.items():
            self.holders.setdefault(image, set()).add(i)
            self.held_size[image] = max(size, self.held_size.get(image, 0))

    def start(self, image_sizes: Mapping[str, int]) -> None:
        for slot in sorted(self.slot_names):
            self.slot_orders[slot] = []
            for i in range(len(self.ids)):
                if self.cap_slots[i][slot] > 0:
                    self.lists_of[i].append(self.slot_orders[slot])
        for image, slot in sorted(self.routes, key=lambda r: (r[0], r[1] or "")):
            if image not in self.bonuses:
                size = image_sizes.get(image, self.held_size.get(image, 0))
                holders = self.holders.get(image, set())
                self.bonuses[image] = locality_bonus(
                    size, len(holders), len(self.ids), self.locality_weight
                )
            if self.bonuses[image]:
                self.holder_orders[(image, slot)] = []
                for i in self.holders[image]:
                    if slot is None or self.cap_slots[i][slot] > 0:
                        self.lists_of[i].append(self.holder_orders[(image, slot)])
        for i in range(len(self.ids)):
            self._index(i)

    def _index(self, i: int) -> None:
        """Put agent i into its lists at its current score, unless too full for any request."""
        if self.free_cpu[i] < self.min_cpu or self.free_mem[i] < self.min_mem:
            return
        if self.min_slots and any(self.free_slots[i][k] < a for k, a in self.min_slots.items()):
            return
        used = (1 - self.free_cpu[i] / self.cap_cpu[i] + 1 - self.free_mem[i] / self.cap_mem[i]) / 2
        score = used if self.concentrated else 1 - used
        key = (-score, self.ids[i], i)
        self.keys[i] = key
        for order in self.lists_of[i]:
            bisect.insort(order, key)

    def _take(self, i: int, cpu: int, mem: int, slots: SlotAsk) -> None:
        """Change agent i's free room by -cpu / -mem / -slots (negative to give back)."""
        key = self.keys[i]
        if key is not None:
            for order in self.lists_of[i]:
                del order[bisect.bisect_left(order, key)]
            self.keys[i] = None
        self.free_cpu[i] -= cpu
        self.free_mem[i] -= mem
        free = self.free_slots[i]
        for k, a in slots:
            free[k] -= a
        self._index(i)

    def _first_fit(self, order: list[Key], cpu: int, mem: int, slots: SlotAsk) -> Key | None:
        """The best-scoring entry of `order` with room for (cpu, mem, slots)."""
        free_cpu, free_mem = self.free_cpu, self.free_mem
        if not slots:  # the common case, kept to two comparisons per agent
            for seen, key in enumerate(order, 1):
                i = key[2]
                if free_cpu[i] >= cpu and free_mem[i] >= mem:
                    self.examined += seen
                    return key
        else:
            free_slots = self.free_slots
            for seen, key in enumerate(order, 1):
                i = key[2]
                if (
                    free_cpu[i] >= cpu
                    and free_mem[i] >= mem
                    and all(free_slots[i][k] >= a for k, a in slots)
                ):
                    self.examined += seen
                    return key
        self.examined += len(order)
        return None

    def _pick(self, cpu: int, mem: int, slots: SlotAsk, image: str) -> int | None:
        """The agent with room for (cpu, mem, slots) and the highest score, plus the image's
        locality bonus if it holds the image; ties to the smaller agent_id."""
        slot = slots[0][0] if slots else None  # only agents offering it can fit
        best = self._first_fit(
            self.order if slot is None else self.slot_orders[slot], cpu, mem, slots
        )
        holders = self.holder_orders.get((image, slot))
        if best is None or holders is None:
            return None if best is None else best[2]
        bonus = self.bonuses[image]
        if best[2] in self.holders[image]:
            return best[2]  # the best overall holds the image too
        holder = self._first_fit(holders, cpu, mem, slots)
        if holder is not None and (holder[0] - bonus, holder[1]) < best[:2]:
            return holder[2]
        return best[2]

    def _known_no_room(self, cpu: int, mem: int, slots: SlotAsk) -> bool:
        if any(c <= cpu and m <= mem for c, m in self.no_room):
            return True
        if not slots or not self.no_room_slots:
            return False  # a shape with slots never covers one without
        return self._known_no_room_slots(cpu, mem, slots)

    def _known_no_room_slots(self, cpu: int, mem: int, slots: SlotAsk) -> bool:
        asked = dict(slots)
        return any(
            c <= cpu and m <= mem and all(asked.get(k, 0) >= a for k, a in s.items())
            for c, m, s in self.no_room_slots
        )

    def _remember_no_room(self, cpu: int, mem: int, slots: SlotAsk) -> None:
        if slots:
            self.no_room_slots.append((cpu, mem, dict(slots)))
        else:
            self.no_room.append((cpu, mem))

    def place(self, session: PendingSession) -> tuple[dict[str, str] | None, str]:
        """Placements for every kernel, or None and the status_info saying what was needed."""
        if not self.ids:
            return None, no_live_agents(self.name, self.live_groups)
        n, single = session.cluster_size, _single(session)
        cpu, mem = _mc_up(session.resources.cpu), session.resources.mem
        slots = _slot_ask(session.resources)
        if not self._ever(cpu, mem, slots, n, single):
            return None, self._never_info(session)
        if single:  # one block of n kernels on one agent
            cpu, mem, slots = cpu * n, mem * n, _times(slots, n)
            if self._known_no_room(cpu, mem, slots):
                return None, self._no_room_info(session, 0)
            i = self._pick(cpu, mem, slots, session.image)
            if i is None:
                self._remember_no_room(cpu, mem, slots)
                return None, self._no_room_info(session, 0)
            self._take(i, cpu, mem, slots)
            return {k: self.ids[i] for k in session.kernel_ids}, ""
        if any(c <= cpu and m <= mem for c, m in self.no_room) or (
            slots and self.no_room_slots and self._known_no_room_slots(cpu, mem, slots)
        ):
            return None, self._no_room_info(session, 0)
        taken: list[int] = []
        for _ in session.kernel_ids:
            i = self._pick(cpu, mem, slots, session.image)
            if i is None:
                break
            self._take(i, cpu, mem, slots)
            taken.append(i)
        if len(taken) == n:
            return {k: self.ids[i] for k, i in zip(session.kernel_ids, taken, strict=True)}, ""
        back = _times(slots, -1)
        for i in taken:  # all-or-nothing: give back what this session took
            self._take(i, -cpu, -mem, back)
        if not taken:
            self._remember_no_room(cpu, mem, slots)
        return None, self._no_room_info(session, len(taken))

    def _no_room_info(self, session: PendingSession, fitted: int) -> str:
        r, n = session.resources, session.cluster_size
        if _single(session):
            need = _need(r.cpu * n, r.mem * n, {k: v * n for k, v in r.slots.items()})
            return (
                f"{NO_INSTANCES}: no live agent in resource group {self.name!r} has {need} free"
                f" for the {n} kernels of this single-node session"
            )
        need = _need(r.cpu, r.mem, r.slots)
        if n == 1:
            return f"{NO_INSTANCES}: no live agent in resource group {self.name!r} has {need} free"
        return (
            f"{NO_INSTANCES}: live agents in resource group {self.name!r} have room for"
            f" {fitted} of {n} kernels of {need} each"
        )

    def _never_info(self, session: PendingSession) -> str:
        """Why the group's live agents could not hold the session even when idle."""
        r, n = session.resources, session.cluster_size
        short = []  # slots no agent offers enough of for one kernel: the likeliest cause
        for k, a in _slot_ask(r):
            most = max(c[k] for c in self.cap_slots)
            if most < a:
                have = f"the most is {fmt_amount(most / 1000)}" if most else f"none offers {k}"
                short.append(f"{k} {fmt_amount(r.slots[k])} per kernel ({have})")
        if short:
            return (
                f"{NO_INSTANCES}: no live agent of resource group {self.name!r} offers "
                + " nor ".join(short)
            )
        if _single(session):
            total_slots = {k: v * n for k, v in r.slots.items()}
            need = _need(r.cpu * n, r.mem * n, total_slots)
            lacking = []  # the dimensions in which even the biggest agent is too small
            if max(self.cap_cpu) < _mc_up(r.cpu) * n:
                lacking.append(f"{float(max(self.cap_cpu) / 1000)} cpu")
            if max(self.cap_mem) < r.mem * n:
                lacking.append(fmt_mem(max(self.cap_mem)))
            for k, a in _times(_slot_ask(r), n):
                most = max(c[k] for c in self.cap_slots)
                if most < a:
                    lacking.append(f"{k} {fmt_amount(most / 1000)}")
            have = (
                f"the most any live agent of resource group {self.name!r} has: {', '.join(lacking)}"
                if lacking
                else f"no live agent of resource group {self.name!r} has all of it at once"
            )
            return (
                f"{NO_INSTANCES}: single-node session needs {need} on one agent"
                f" ({n} kernels); {have}"
            )
        return (
            f"{NO_INSTANCES}: the live agents of resource group {self.name!r} cannot hold"
            f" {n} kernel(s) of {_need(r.cpu, r.mem, r.slots)} even when idle"
        )

    def could_ever_fit(self, session: PendingSession) -> bool:
        """Whether the group's live agents, idle, could hold the whole session."""
        cpu, mem, n = _mc_up(session.resources.cpu), session.resources.mem, session.cluster_size
        return self._ever(cpu, mem, _slot_ask(session.resources), n, _single(session))

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

    def refusal(self, session: PendingSession) -> tuple[str, str]:
        """(field, why) the group's live agents could not hold ``session`` even when idle,
        naming the largest agent in the dimension that falls short (see ``never_holds``)."""
        r, n = session.resources, session.cluster_size
        single = _single(session)
        per = n if single else 1  # kernels one agent must hold at once
        whose = f"resource group {self.name!r}"
        asks: list[tuple[str, int, list[int]]] = [
            ("cpu", _mc_up(r.cpu) * per, self.cap_cpu),
            ("mem", r.mem * per, self.cap_mem),
            *((k, a * per, [c[k] for c in self.cap_slots]) for k, a in _slot_ask(r)),
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
        need = _need(r.cpu * per, r.mem * per, {k: v * per for k, v in r.slots.items()})
        if single or not self._idle_room(_mc_up(r.cpu), r.mem, _slot_ask(r)):
            return "resources", f"{need}: no live agent of {whose} has all of it at once"
        room = self._idle_room(_mc_up(r.cpu), r.mem, _slot_ask(r))
        return "cluster_size", (
            f"{n} kernels of {need} each, but the live agents of {whose} hold {room} of them"
            " even when idle"
        )


def never_holds(
    resources: Resources,
    cluster_size: int,
    cluster_mode: ClusterMode,
    resource_group: str,
    agents: Sequence[AgentView],
) -> tuple[str, str] | None:
    """(field, why) when the live agents of ``resource_group`` could not hold the session even
    when idle (the scheduler's own test, ``_Group.could_ever_fit``), so it could never start:
    multi-node, each kernel must fit an agent and all of them the group; single-node, all of
    them one agent.  None when they could, and when the group has no live agent at all (agents
    still starting: the session waits for them)."""
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
        self._groups: dict[frozenset[str], _Group] = {}  # by the slot names asked

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
        slots = frozenset(k for k, v in resources.slots.items() if v > 0)
        group = self._groups.get(slots)
        if group is None:
            group = self._groups[slots] = _Group(self.resource_group, Policy())
            group.note_request(session)  # the slot names its capacity lists keep
            for agent in self._agents:
                group.add_agent(agent)
        if group.could_ever_fit(session):  # memoized per shape (_Group.ever)
            return None
        return group.refusal(session)


def _single(session: PendingSession) -> bool:
    """Whether the session is placed as one block (a one-kernel session is the same either
    way, and keeps the one-kernel wording)."""
    return session.cluster_mode == "single-node" and session.cluster_size > 1
