"""The agent's own facts on its aggregate (``hoist.events.agent.<id>``).

The manager appends to the same subject (AgentLost), so every write may meet a concurrency
conflict: reload and apply the command again.  Writes of one agent are serialized, so its own
facts never race each other.  An agent that finds itself marked lost while alive re-registers
before recording anything else: it is back, and says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agent.runtime.base import PulledImage
from domain import events as ev
from domain.agent import Agent
from domain.subjects import agent_events
from services.eventstore.repository import NotFound, Repository, loaded_seq
from services.eventstore.store import ConcurrencyError

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
                if await self._save(agent):
                    return first
        raise RuntimeError(f"agent {self.agent_id}: registration kept conflicting; retry later")

    async def record(self, command: Callable[[Agent], None]) -> None:
        """Apply ``command`` to the current aggregate and save its events."""
        async with self._lock:
            for _ in range(ATTEMPTS):
                agent = self._aggregate or await self._load()
                assert agent is not None
                try:
                    if agent.lost:
                        await self._reregister(agent)
                    command(agent)
                except BaseException:
                    self._aggregate = None  # it may hold unsaved events now
                    raise
                if await self._save(agent):
                    return
        raise RuntimeError(f"agent {self.agent_id}: its subject kept changing; retry later")

    async def refresh(self) -> bool:
        """Reload if someone else appended (e.g. AgentLost) and re-register if marked lost;
        True if the agent re-registered."""
        async with self._lock:
            store = self.repository.store
            last = await store.last_seq(agent_events(self.agent_id))
            if self._aggregate is not None and loaded_seq(self._aggregate) == last:
                return False
            agent = await self._load()
            assert agent is not None
            if not agent.lost:
                return False
            await self._reregister(agent)
            return await self._save(agent)

    async def _reregister(self, agent: Agent) -> None:
        reg = await self.report()
        log.warning(
            "agent %s was marked lost (%s): re-registering", self.agent_id, agent.status_info
        )
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

    async def _save(self, agent: Agent) -> bool:
        try:
            await self.repository.save(agent)
        except ConcurrencyError:
            self._aggregate = None  # someone else appended: load again and decide again
            return False
        except BaseException:
            self._aggregate = None
            raise
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

    async def pull_failed(self, image: str, task_id: str, reason: str) -> None:
        def command(agent: Agent) -> None:
            if agent.pulls.get(image) == task_id:
                agent.pull_failed(image, task_id, reason)

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
