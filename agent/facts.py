"""The agent's own facts on its aggregate (``hoist.events.agent.<id>``).

Only this agent writes its subject, and its writes are serialized, so its own facts never race
each other (a conflict still reloads and applies the command again).  The manager records a loss
on the agent's liveness subject (``hoist.events.liveness.<id>``); the agent reads what came
there after its latest registration and, marked lost while alive, re-registers before
recording anything else: it is back, and says so.  Lost means: the latest AgentLost is later
in the stream than the agent's latest (re)registration (domain.liveness.is_lost).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agent.runtime.base import PulledImage
from domain import events as ev
from domain.admission import Inadmissible, admit
from domain.agent import Agent
from domain.subjects import agent_events, liveness_events
from eventstore.quarantine import quarantined
from eventstore.repository import NotFound, Repository
from eventstore.store import ConcurrencyError

log = logging.getLogger(__name__)

ATTEMPTS = 10


@dataclass(frozen=True)
class Registration:
    resource_group: str
    capacity: ev.Capacity
    runtime: str
    images: dict[str, ev.HeldImage]


Report = Callable[[], Awaitable[Registration]]


class AgentFacts:
    def __init__(self, repository: Repository, agent_id: str, report: Report) -> None:
        self.repository = repository
        self.agent_id = agent_id
        self.report = report  # what the agent has now, for (re)registration
        self._aggregate: Agent | None = None
        self._registered_seq = 0  # stream sequence of this process's latest (re)registration
        self._lock = asyncio.Lock()

    async def register(self) -> bool:
        """AgentRegistered the first time, AgentReregistered after; True if first."""
        first = False

        def command(agent: Agent | None, reg: Registration) -> Agent:
            nonlocal first
            if agent is None:
                first = True
                return Agent.register(
                    agent_id=self.agent_id,
                    resource_group=reg.resource_group,
                    capacity=reg.capacity,
                    runtime=reg.runtime,
                    images=reg.images,
                )
            first = False
            agent.reregister(
                resource_group=reg.resource_group,
                capacity=reg.capacity,
                runtime=reg.runtime,
                images=reg.images,
            )
            return agent

        async with self._lock:
            for _ in range(ATTEMPTS):
                agent = await self._load(missing_ok=True)
                agent = command(agent, await self.report())
                if await self._save(agent, registering=True):
                    return first
        raise RuntimeError(f"agent {self.agent_id}: registration kept conflicting; retry later")

    async def record(self, command: Callable[[Agent], None]) -> None:
        """Apply ``command`` to the current aggregate and save its events."""
        async with self._lock:
            for _ in range(ATTEMPTS):
                agent = self._aggregate or await self._load()
                assert agent is not None
                try:
                    why = await self._lost()
                    if why is not None:
                        await self._reregister(agent, why)
                    command(agent)
                except BaseException:
                    self._aggregate = None  # it may hold unsaved events now
                    raise
                if await self._save(agent, registering=why is not None):
                    return
        raise RuntimeError(f"agent {self.agent_id}: its subject kept changing; retry later")

    async def refresh(self) -> bool:
        """Re-register if the manager marked this agent lost since it last registered; True if
        the agent re-registered."""
        async with self._lock:
            why = await self._lost()
            if why is None:
                return False
            agent = self._aggregate or await self._load()
            assert agent is not None
            await self._reregister(agent, why)
            return await self._save(agent, registering=True)

    async def _lost(self) -> str | None:
        """Why the manager marked this agent lost after its latest registration, else None."""
        # What came after the registration (domain.liveness.is_lost); only an admissible
        # AgentLost is a loss (a message nats-server reflected onto the subject is not the
        # manager's).
        after = self._registered_seq
        subject = liveness_events(self.agent_id)
        for record in reversed(await self.repository.store.read_subject(subject, after)):
            try:
                event = admit(record.subject, record.headers, record.data)
            except Inadmissible as e:
                quarantined(record.seq, record.subject, record.headers, e.reason, "agent")
                continue
            return getattr(event, "status_info", "lost")
        return None

    async def _reregister(self, agent: Agent, why: str) -> None:
        reg = await self.report()
        log.warning("agent %s was marked lost (%s): re-registering", self.agent_id, why)
        agent.reregister(
            resource_group=reg.resource_group,
            capacity=reg.capacity,
            runtime=reg.runtime,
            images=reg.images,
        )

    async def _load(self, missing_ok: bool = False) -> Agent | None:
        try:
            self._aggregate = await self.repository.get(Agent, self.agent_id)
        except NotFound:
            if not missing_ok:
                raise
            self._aggregate = None
        return self._aggregate

    async def _save(self, agent: Agent, registering: bool = False) -> bool:
        """Save; ``registering``: its first pending event is a (re)registration."""
        try:
            seqs = await self.repository.save(agent)
        except ConcurrencyError:
            self._aggregate = None  # someone else appended: load again and decide again
            return False
        except BaseException:
            self._aggregate = None
            raise
        if registering and seqs:
            self._registered_seq = seqs[0]
        self._aggregate = agent
        return True

    # -- pull facts (agent.pulls.PullEvents) ---------------------------------------------------

    async def pull_started(self, image: str, task_id: str) -> None:
        def command(agent: Agent) -> None:
            running = agent.pulls.get(image)
            if running is not None and running != task_id:
                # Its end was never recorded (the store was unreachable then): it is over.
                agent.pull_failed(image, running, f"abandoned: superseded by task {task_id}")
            agent.pull_started(image, task_id)

        await self.record(command)

    async def pulled(self, task_id: str, image: PulledImage, duration_s: float) -> None:
        def command(agent: Agent) -> None:
            if agent.pulls.get(image.image) != task_id:
                # Re-registered meanwhile (marked lost), which cleared the pulls.
                agent.pull_started(image.image, task_id)
            agent.pulled(image.image, task_id, image.digest, image.size_bytes, duration_s)

        await self.record(command)

    async def pull_failed(
        self, image: str, task_id: str, reason: str, cancelled: bool = False
    ) -> None:
        def command(agent: Agent) -> None:
            if agent.pulls.get(image) == task_id:
                agent.pull_failed(image, task_id, reason, cancelled)

        await self.record(command)

    @property
    def aggregate(self) -> Agent | None:
        """The aggregate as last loaded or saved (None before registration)."""
        return self._aggregate

    async def image_preloaded(self, image: str, reason: str, pinned: bool) -> None:
        def command(agent: Agent) -> None:
            if image in agent.images:
                agent.mark_preloaded(image, reason, pinned)

        await self.record(command)

    async def image_removed(self, image: str, reason: str) -> None:
        def command(agent: Agent) -> None:
            if image in agent.images:
                agent.image_removed(image, reason)

        await self.record(command)

    async def kernel_exited(
        self, kernel_id: str, session_id: str, exit_code: int, ran_s: float, oom_killed: bool
    ) -> None:
        """KernelExited: a kernel's process ended here (once per container: the caller's rule)."""

        def command(agent: Agent) -> None:
            agent.kernel_exited(kernel_id, session_id, exit_code, ran_s, oom_killed)

        await self.record(command)

    async def recorded_exits(self) -> set[tuple[str, str, int, float]]:
        """(kernel id, session id, exit code, ran_s) of every KernelExited on this agent's
        subject: what a restarted agent must not record again (one read of the subject)."""
        out: set[tuple[str, str, int, float]] = set()
        subject = agent_events(self.agent_id)
        for record in await self.repository.store.read_subject(subject):
            try:
                event = admit(record.subject, record.headers, record.data)
            except Inadmissible:
                continue  # not this agent's fact (quarantined when the aggregate is loaded)
            if isinstance(event, ev.KernelExited):
                out.add((event.kernel_id, event.session_id, event.exit_code, event.ran_s))
        return out
