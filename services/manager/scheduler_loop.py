"""The scheduler reactor: places pending sessions with ``domain.scheduling``'s policy, on the
fleet's kept index of live agents (``domain.placement_index.plan_indexed``: a pass visits the
agents the pending sessions' picks walk past, not every agent).

Woken on SessionEnqueued and whenever room may have appeared (a kernel stopped occupying an
agent, an agent (re)registered, an owner's session ended).  Wake-ups coalesce and one pass
runs at a time: a pass plans on the fleet view and applies every placement to the cached
sessions before it awaits anything, so the next pass already sees that room as reserved and
two sessions never get the same capacity, however many were enqueued at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from domain.errors import DomainError
from domain.placement_index import plan_indexed
from domain.quota import Quota, effective
from domain.reasons import Reason
from domain.scheduling import (
    Limits,
    PendingSession,
    Policy,
    Scheduled,
    Unschedulable,
)
from domain.session import Session
from services.manager.fleet import Fleet
from services.manager.uow import UnitOfWork
from services.transport.tasks import Tasks, every

log = logging.getLogger(__name__)

# plan(pending, agents, owner_sessions, limits, policy, image_sizes, quotas=..., usage=...)
Plan = Callable[..., list[Scheduled | Unschedulable]]


class SchedulerLoop:
    def __init__(
        self,
        fleet: Fleet,
        uow: UnitOfWork,
        limits: Limits,
        policy: Policy,
        planner: Plan | None = None,
    ) -> None:
        self.fleet = fleet
        self.uow = uow
        self.limits = limits
        self.policy = policy
        self.planner = planner  # None: plan_indexed on the fleet's kept index
        self.passes = 0
        self._wake = asyncio.Event()
        self._tasks = Tasks()

    def wake(self, _message: object = None) -> None:
        """Run a pass soon (a bus handler: a session enqueued, room freed, an agent joined)."""
        self._wake.set()

    def start(self) -> None:
        self._tasks.spawn(every(None, self.run_pass, "scheduling pass", wake=self._wake, now=True))

    async def stop(self) -> None:
        await self._tasks.stop()

    def run_pass(self) -> int:
        """Plan and apply one pass (no await inside: every placement is reserved in the view
        before the next pass); return the number of sessions placed."""
        pending = self.fleet.pending_sessions()
        if not pending:
            return 0
        self.passes += 1
        if self.planner is None:
            decisions = plan_indexed(
                pending,
                self.fleet.agent_index(self.policy),
                self.fleet.owner_sessions,
                self.limits,
                self.fleet.image_sizes,
                quotas=self.quotas(pending),
                usage=self.fleet.owner_usage,
            )
        else:
            decisions = self.planner(
                pending,
                self.fleet.agent_views(),
                self.fleet.owner_sessions,
                self.limits,
                self.policy,
                self.fleet.image_sizes,
                quotas=self.quotas(pending),
                usage=self.fleet.owner_usage,
            )
        placed = 0
        for decision in decisions:
            try:
                save = self.uow.change_now(decision.session_id, _decided(decision))
            except DomainError as e:
                log.warning("session %s: %s", decision.session_id, e)
                continue
            if save is not None:
                placed += isinstance(decision, Scheduled)
                self._tasks.spawn(self._saved(save), f"save {decision.session_id}")
        return placed

    def quotas(self, pending: Sequence[PendingSession]) -> dict[str, Quota]:
        """The effective resource policy of each pending session's owner that has one."""
        policies = self.fleet.resource_policies
        if not policies:
            return {}
        out = {}
        for owner in {s.owner for s in pending}:
            policy = effective(owner, policies)
            if policy is not None:
                out[owner] = policy.quota
        return out

    async def _saved(self, save: Awaitable[bool]) -> None:
        if not await save:
            self.wake()  # the reload may have put it back in the queue


def _decided(decision: Scheduled | Unschedulable) -> Callable[[Session], None]:
    """What a scheduling decision records on its session."""
    if isinstance(decision, Scheduled):
        return lambda s: s.schedule(decision.placements, Reason.SCHEDULED)
    return lambda s: s.scheduling_failed(decision.status_info)
