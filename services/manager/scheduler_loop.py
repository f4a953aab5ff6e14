"""The scheduler reactor: places pending sessions with ``domain.scheduling.plan``.

Woken on SessionEnqueued and whenever room may have appeared (a kernel stopped occupying an
agent, an agent (re)registered, an owner's session ended).  Wake-ups coalesce and one pass
runs at a time: a pass plans on the fleet view and applies every placement to the cached
sessions before it awaits anything, so the next pass already sees that room as reserved and
two sessions never get the same capacity, however many were enqueued at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from domain.errors import DomainError
from domain.scheduling import (
    AgentView,
    Limits,
    PendingSession,
    Policy,
    Scheduled,
    Unschedulable,
    plan,
)
from domain.session import Session
from services.manager.fleet import Fleet

log = logging.getLogger(__name__)

Plan = Callable[
    [Sequence[PendingSession], Sequence[AgentView], Mapping[str, int], Limits, Policy],
    list[Scheduled | Unschedulable],
]


class SchedulerLoop:
    def __init__(
        self,
        fleet: Fleet,
        limits: Limits,
        policy: Policy,
        on_scheduled: Callable[[str], None],
        planner: Plan = plan,
    ) -> None:
        self.fleet = fleet
        self.limits = limits
        self.policy = policy
        self.on_scheduled = on_scheduled
        self.planner = planner
        self.passes = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._saves: set[asyncio.Task[None]] = set()

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())
        self.wake()

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._saves) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self.run_pass()
            except Exception:
                log.exception("scheduling pass failed")
            # Let the saves of this pass and new enqueues in before the next pass.
            await asyncio.sleep(0)

    def run_pass(self) -> int:
        """Plan and apply one pass (no await inside); return the number of sessions placed."""
        pending = self.fleet.pending_sessions()
        if not pending:
            return 0
        self.passes += 1
        decisions = self.planner(
            pending, self.fleet.agent_views(), self.fleet.owner_sessions, self.limits, self.policy
        )
        placed = 0
        for decision in decisions:
            sid = decision.session_id
            session = self.fleet.sessions.get(sid)
            if session is None or not self.fleet.try_lock(sid):
                continue
            try:
                if isinstance(decision, Scheduled):
                    session.schedule(decision.placements)
                    placed += 1
                else:
                    session.scheduling_failed(decision.status_info)
            except DomainError as e:
                log.warning("session %s: %s", sid, e)
                session.collect_events()
            if not session.pending_events:
                self._spawn(self.fleet.unlock(sid))
                continue
            # Reserve now in the view (the save is still on its way), then store it.
            self.fleet.reindex(session)
            self._spawn(self._save(session, isinstance(decision, Scheduled)))
        return placed

    async def _save(self, session: Session, scheduled: bool) -> None:
        try:
            stored = await self.fleet.commit(session)
        finally:
            await self.fleet.unlock(session.id)
        if stored and scheduled:
            self.on_scheduled(session.id)
        elif not stored:
            self.wake()  # the reload may have put it back in the queue

    def _spawn(self, coro: object) -> None:
        task = asyncio.create_task(coro)  # type: ignore[arg-type]
        self._saves.add(task)
        task.add_done_callback(self._saves.discard)
