"""The scheduling policy: which pending sessions start now, and on which agents.

``plan`` is pure: given the pending sessions, the agents as the manager sees them this moment,
the per-owner session counts, the limits and the policy, it decides every session once —
``Scheduled`` with a placement for each kernel, or ``Unschedulable`` with the status_info the
session keeps while it stays PENDING (``predicate-checks-failed: ...`` or
``no-available-instances: ...``, Backend.AI's status_info wording).

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

Cost: the agents are kept sorted best first per resource group (domain.placement_index): a
pick takes the first fit of the request's list (all agents, or those offering its first slot)
and of the image holders' list and compares the two, so a plan walks past few agents.
``plan`` builds that index for its call; the manager keeps one between passes and calls
``plan_indexed``. A request shape (cpu, mem, slots) that found no room is remembered so bigger
ones fail without a walk.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from domain.group_capacity import IdleRoom, never_holds
from domain.milli_units import mc_up, slot_ask
from domain.placement_index import AgentIndex, GroupIndex
from domain.quota import Quota, Usage, fmt_mem, quota_failures, totals
from domain.reasons import Reason
from domain.scheduling_types import (
    NO_INSTANCES,
    AgentView,
    Limits,
    PendingSession,
    PlanStats,
    Policy,
    Scheduled,
    Unschedulable,
    check_unique,
    locality_bonus,
)

# The scheduler's vocabulary is imported from here; the types live below the index.
__all__ = [
    "AgentView",
    "IdleRoom",
    "Limits",
    "PendingSession",
    "PlanStats",
    "Policy",
    "Scheduled",
    "Unschedulable",
    "decide_all",
    "locality_bonus",
    "never_holds",
    "plan",
    "plan_indexed",
]

PREDICATE_FAILED = Reason.PREDICATE_CHECKS_FAILED


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
    index = AgentIndex(policy, agents)
    return plan_indexed(
        pending, index, owner_sessions, limits, image_sizes, stats, quotas=quotas, usage=usage
    )


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
    """``plan`` on the index's agents with ``index.policy``, visiting only the agents the
    pending sessions' picks walk past; the index is as it was when this returns."""
    check_unique("pending", [s.session_id for s in pending])
    queue = sorted(pending, key=lambda s: (s.enqueued_at, s.session_id))
    used: dict[str, GroupIndex] = {}
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


def decide_all(
    queue: Sequence[PendingSession],
    group_of: Callable[[str], GroupIndex],
    fleet_total: Mapping[str, int],
    owner_sessions: Mapping[str, int],
    limits: Limits,
    policy: Policy,
    quotas: Mapping[str, Quota],
    usage: Mapping[str, Usage],
) -> list[Scheduled | Unschedulable]:
    """Decide every session of ``queue`` (sorted FIFO) in the policy's order, placing each
    through the index of its resource group (``fleet_total``: what the live agents offer
    together, drf's denominator)."""
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
                now = {"cpu": mc_up(u.cpu), "mem": u.mem}
                now.update((k, mc_up(v)) for k, v in u.slots.items())
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
                asked.append(("cpu", mc_up(session.resources.cpu) * n))
            if "mem" in held:
                asked.append(("mem", session.resources.mem * n))
            if session.resources.slots:
                asked += [(k, a * n) for k, a in slot_ask(session.resources) if k in held]
            for r, amount in asked:
                held[r] += amount
                if held[r] / total[r] > share:
                    share = held[r] / total[r]
        if sessions:
            heapq.heapreplace(self.heap, (share, sessions[0]))
        else:
            heapq.heappop(self.heap)


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
