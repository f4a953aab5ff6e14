"""The scheduler reactor: places pending sessions with ``domain.scheduling``'s policy, on the
fleet's kept index of live agents (``domain.scheduling.plan_indexed``: a pass visits the
agents the pending sessions' picks walk past, not every agent).

Woken on SessionEnqueued and whenever room may have appeared (a kernel stopped occupying an
agent, an agent (re)registered, an owner's session ended).  Wake-ups coalesce and one pass
runs at a time: a pass plans on the fleet view and applies every placement to the cached
sessions and agents' reservations before it awaits anything, so the next pass already sees
that room as reserved and two sessions never get the same capacity, however many were
enqueued at once.

Against other managers (and a paused ex-leader), the log decides: a pass's placements go in
one atomic batch, each SessionScheduled (and its kernels' KernelPreparing, or KernelPrepared
and KernelCreating where the log shows the image on the agent) with a
CapacityReserved on each chosen agent's reservation subject (domain.reservation), every
subject expecting the sequence the view has (and the leader's fence,
services.manager.leadership).  Two managers deciding on the same room
get one stored batch and one refused; the refused one reloads and decides again.  Ended
kernels' room is released on the same subjects in the next batch.  A batch costs nats-server
several times a single append, so a pass puts all its decisions in one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence

from domain.errors import DomainError
from domain.quota import Quota, effective
from domain.reasons import Reason, scheduler_error
from domain.reservation import AgentReservations, lacks
from domain.scheduling import (
    Limits,
    PendingSession,
    Policy,
    Scheduled,
    Unschedulable,
    plan_indexed,
)
from domain.session import Session
from eventstore.store import MAX_BATCH, Write
from services.manager.fleet import Fleet
from services.manager.leadership import NotLeading
from services.manager.uow import UnitOfWork
from transport.tasks import Tasks, every

log = logging.getLogger(__name__)

SAVE_WAIT_S = 10.0  # how long a stop waits for the appends in flight

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
        fence: Callable[[], Sequence[Write]] = tuple,
        on_pass: Callable[[float], None] | None = None,
    ) -> None:
        self.fleet = fleet
        self.uow = uow
        self.on_pass = on_pass  # told each pass's seconds (the manager's stats)
        self.limits = limits
        self.policy = policy
        self.planner = planner  # None: plan_indexed on the fleet's kept index
        # The leader's fence for each batch (services.manager.leadership); none unleased.
        self.fence = fence
        self.passes = 0
        self._wake = asyncio.Event()
        self._tasks = Tasks()  # the loop
        # Appends in flight: a stop lets them finish (each is a unit: the view reloads what a
        # refused one held, and the reservations know which agents' subjects are in flight).
        self._saves = Tasks()

    def wake(self, _message: object = None) -> None:
        """Run a pass soon (a bus handler: a session enqueued, room freed, an agent joined)."""
        self._wake.set()

    def start(self) -> None:
        self._tasks.spawn(every(None, self.run_pass, "scheduling pass", wake=self._wake, now=True))

    async def stop(self) -> None:
        await self._tasks.stop()
        if len(self._saves):
            await asyncio.wait(list(self._saves), timeout=SAVE_WAIT_S)
        await self._saves.stop()

    async def run_pass(self) -> int:
        """One scheduling pass (``_pass``), its duration told to ``on_pass``."""
        started = time.perf_counter()
        try:
            return await self._pass()
        finally:
            if self.on_pass is not None:
                self.on_pass(time.perf_counter() - started)

    async def _pass(self) -> int:
        """Plan one pass on the fleet view and store it in one atomic batch: each placed
        session's SessionScheduled and KernelPreparing with its agents' reservations, and the
        releases of ended kernels, each expecting its subject's last sequence (plus the
        leader's fence).

        The batch is not awaited: the next pass may go on with other agents meanwhile, while
        a decision on an agent whose subject is still being appended to waits for the next
        pass after that append (its expected sequence is not known before).  A refused batch
        reloads what it held and wakes the next pass.  Returns the sessions placed."""
        booked = self.fleet.reservations
        await booked.refresh()
        due = {a: ended for a, ended in booked.due().items() if not booked.busy(a)}
        pending = self.fleet.pending_sessions()
        if not pending and not due:
            return 0
        try:
            fence = self.fence()  # before anything is claimed: from here on nothing awaits
        except NotLeading:
            return 0  # it stepped down meanwhile: the new leader plans
        touched: dict[str, AgentReservations] = {}
        for agent_id, ended in due.items():
            reservations = booked.by_agent[agent_id]
            for session_id, kernel_ids in ended.items():
                reservations.release(session_id, kernel_ids, f"kernels ended: {kernel_ids}")
            touched[agent_id] = reservations
            booked.recount(agent_id)
        sessions: list[Session] = []
        placed = 0
        if pending:
            self.passes += 1
            # one for the fence, whose check moves onto a session's event when the batch places one
            room = MAX_BATCH - 1 - sum(len(r.pending_events) for r in touched.values())
            for decision in self._decisions(pending):
                try:
                    if isinstance(decision, Unschedulable):
                        self._save_alone(decision)
                        continue
                    on_agents = _by_agent(decision)
                    if any(booked.busy(a) for a in on_agents):
                        continue  # the end of that append wakes the next pass
                    holding = self._holding(decision.session_id, on_agents)
                    # SessionScheduled, a KernelPreparing per kernel (or KernelPrepared and
                    # KernelCreating when its agents hold the image), a reservation per agent
                    per_kernel = 2 if holding else 1
                    messages = 1 + per_kernel * len(decision.placements) + len(on_agents)
                    if messages > room:
                        self.wake()  # the rest in the next pass's batch
                        break
                    if not self._room_held(decision, on_agents):
                        continue
                    session = self.uow.claim(decision.session_id, _decided(decision, holding))
                except DomainError as e:
                    log.warning("session %s: %s", decision.session_id, e)
                    continue
                except Exception as e:  # a bug: this session says so, the others go on
                    self._failed(decision.session_id, e)
                    continue
                if session is None:
                    continue
                for agent_id, kernel_ids in on_agents.items():
                    touched[agent_id] = AgentReservations.reserve(
                        booked.by_agent.get(agent_id),
                        agent_id,
                        self.fleet.agents[agent_id].agent.capacity,
                        session.id,
                        kernel_ids,
                        session.resources,
                    )
                    booked.by_agent[agent_id] = touched[agent_id]
                sessions.append(session)
                room -= messages
                placed += 1
        for agent_id in touched:
            booked.recount(agent_id)
        if sessions or touched:
            booked.begin(touched)
            batch = self.uow.save_claimed(sessions, list(touched.values()), fence)
            self._saves.spawn(self._saved(batch), f"schedule {len(sessions)} sessions")
        return placed

    def _decisions(self, pending: list[PendingSession]) -> Iterator[Scheduled | Unschedulable]:
        """The plan's decisions.  A plan that raises is made again one session at a time, in
        enqueue order, each once the decisions before it were taken (their room is reserved
        in the view by then): a session whose own plan raises gets ``scheduler-error`` as its
        reason and the others are placed (FIFO order only: no strict FIFO or drf among them)."""
        try:
            decisions = self._plan(pending)
        except Exception:
            log.exception("the plan of %d sessions failed: planning each alone", len(pending))
        else:
            yield from decisions
            return
        for one in sorted(pending, key=lambda s: (s.enqueued_at, s.session_id)):
            try:
                alone = self._plan([one])
            except Exception as e:
                self._failed(one.session_id, e)
                continue
            yield from alone

    def _failed(self, session_id: str, error: Exception) -> None:
        """The scheduler raised ``error`` on a session: record ``scheduler-error: ...`` as its
        reason (through the unit of work; logged with the traceback once, not each pass)."""
        session = self.fleet.sessions.get(session_id)
        if session is not None and session.status_info == scheduler_error(error):
            log.debug("session %s: the same scheduler error again: %s", session_id, error)
            return
        log.error("session %s not placed: the scheduler raised", session_id, exc_info=error)
        self._saves.spawn(
            self.uow.try_change(session_id, lambda s: s.scheduler_failed(error), fenced=True),
            f"record the scheduler's error on {session_id}",
        )

    def _plan(self, pending: list[PendingSession]) -> list[Scheduled | Unschedulable]:
        if self.planner is None:
            return plan_indexed(
                pending,
                self.fleet.agent_index(self.policy),
                self.fleet.owner_sessions,
                self.limits,
                self.fleet.image_sizes,
                quotas=self.quotas(pending),
                usage=self.fleet.owner_usage,
            )
        return self.planner(
            pending,
            self.fleet.agent_views(),
            self.fleet.owner_sessions,
            self.limits,
            self.policy,
            self.fleet.image_sizes,
            quotas=self.quotas(pending),
            usage=self.fleet.owner_usage,
        )

    def _room_held(self, decision: Scheduled, on_agents: dict[str, list[str]]) -> bool:
        """Whether each chosen agent's reservations still have the room (the view counts
        more than they do, so this holds unless the view is wrong: then skip it, loudly)."""
        session = self.fleet.sessions.get(decision.session_id)
        if session is None:
            return False
        for agent_id, kernel_ids in on_agents.items():
            state = self.fleet.agents.get(agent_id)
            held = self.fleet.reservations.by_agent.get(agent_id)
            if state is None:
                return False
            if held is not None and any(k in held.held for k in kernel_ids):
                log.warning("session %s already holds room on %s", session.id, agent_id)
                return False
            short = lacks(
                state.agent.capacity,
                [] if held is None else held.held.values(),
                session.resources,
                len(kernel_ids),
            )
            if short:
                log.warning("session %s not placed on %s: %s", session.id, agent_id, short)
                return False
        return True

    def _holding(self, session_id: str, agent_ids: Collection[str]) -> frozenset[str]:
        """``agent_ids`` if the log shows each holding the session's image (its ImagePulled,
        the images it registered with, no ImageRemoved since), else none: no check-and-pull
        is asked, and the kernels are created at once.  All or none: a kernel left PREPARED
        while a sibling pulls would hold no lease on its image (check-and-pull's) meanwhile."""
        session = self.fleet.sessions.get(session_id)
        if session is None:
            return frozenset()
        agents = self.fleet.agents
        if all(session.image in agents[a].agent.images for a in agent_ids):
            return frozenset(agent_ids)
        return frozenset()

    def _save_alone(self, decision: Unschedulable) -> None:
        """Record why a session waits (its own append: it reserves nothing)."""
        try:
            save = self.uow.change_now(decision.session_id, _decided(decision))
        except DomainError as e:
            log.warning("session %s: %s", decision.session_id, e)
            return
        if save is not None:
            self._saves.spawn(self._saved(save), f"save {decision.session_id}")

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
        await save
        # A refused one was reloaded and may be pending again; a stored batch frees its
        # agents' subjects for the decisions that waited on them.
        self.wake()


def _by_agent(decision: Scheduled) -> dict[str, list[str]]:
    """agent id -> the kernels the decision places there."""
    out: dict[str, list[str]] = {}
    for kernel_id, agent_id in decision.placements.items():
        out.setdefault(agent_id, []).append(kernel_id)
    return out


def _decided(
    decision: Scheduled | Unschedulable, holding: Collection[str] = ()
) -> Callable[[Session], None]:
    """What a scheduling decision records on its session, in the batch it is stored in
    anyway (each append of its own was one more round trip and one more step per session):
    placed, its kernels go PREPARING (the reactor asks their agents at once), or PREPARED on
    the agents ``holding`` the image; when all are PREPARED, CREATING (the reactor asks for
    the containers at once; a create that finds the image gone sends the kernel back)."""
    if isinstance(decision, Scheduled):

        def place(s: Session) -> None:
            s.schedule(decision.placements, Reason.SCHEDULED)
            s.start_preparing(holding)
            s.start_creating()

        return place
    return lambda s: s.scheduling_failed(decision.status_info)
