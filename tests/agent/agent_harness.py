"""Helpers for the agent tests: a ready event store and progress stream, running agents
in-process, calling their subjects, reading their events and progress."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
from nats.aio.msg import Msg

from agent.config import AgentConfig
from agent.pulls import PullPolicy
from agent.runtime.base import Runtime
from agent.server import AgentServer
from domain import events as ev
from domain import rpc, subjects
from domain.codec import decode
from domain.image_ref import canonical
from eventstore.store import EventStore
from services.manager.liveness import LivenessWatcher
from transport import progress
from transport.client import Client


@pytest.fixture(name="store")
async def store_fixture(nc: Client) -> EventStore:
    """The event store (HOIST stream) and the progress stream, ready; import it as a fixture."""
    store = EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
    await store.ensure_stream()
    await progress.ensure(nc.jetstream())
    return store


def config(agent_id: str, **overrides: Any) -> AgentConfig:
    pulls = overrides.pop("pulls", None) or PullPolicy(backoff_s=0.05, stall_timeout_s=5)
    values: dict[str, Any] = {
        "agent_id": agent_id,
        "resource_group": "rg",
        "runtime": "dummy",
        "heartbeat_interval_s": 0.2,
        "pulls": pulls,
    }
    return AgentConfig(**{**values, **overrides})


@asynccontextmanager
async def running(
    nc: Client, store: EventStore, runtime: Runtime, cfg: AgentConfig
) -> AsyncIterator[AgentServer]:
    agent = AgentServer(nc, cfg, runtime, store)
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


@asynccontextmanager
async def watching(
    watcher: LivenessWatcher, known_agents: Sequence[str] = ()
) -> AsyncIterator[LivenessWatcher]:
    """``watcher`` started (``known_agents`` with a deadline from now), stopped after."""
    await watcher.start(known_agents)
    try:
        yield watcher
    finally:
        await watcher.stop()


def count_calls(owner: object, name: str) -> list[int]:
    """Count the calls of ``owner``'s async method ``name`` from now on: [calls]."""
    count = [0]
    method = getattr(owner, name)

    async def counted(*args: object, **kwargs: object) -> object:
        count[0] += 1
        return await method(*args, **kwargs)

    setattr(owner, name, counted)
    return count


async def call(nc: Client, agent_id: str, verb: str, payload: object, within: float = 10) -> Any:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    reply = await nc.request(subjects.agent_rpc(agent_id, verb), data, timeout=within)
    return json.loads(reply.data)


async def agent_events(store: EventStore, agent_id: str) -> list[ev.Event]:
    return [
        decode(r.data, r.headers) for r in await store.read_subject(subjects.agent_events(agent_id))
    ]


async def wait_for(check: Callable[[], Any], within: float = 20, what: str = "condition") -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.05)


async def event_of(
    store: EventStore, agent_id: str, kind: type[ev.Event], within: float = 30, **match: Any
) -> Any:
    """Wait for an event of ``kind`` on the agent's subject with the given field values (an
    ``image`` in any spelling: events name images canonically, domain.image_ref)."""
    if "image" in match:
        match = {**match, "image": canonical(match["image"])}

    async def find() -> ev.Event | None:
        for e in await agent_events(store, agent_id):
            if isinstance(e, kind) and all(getattr(e, k) == v for k, v in match.items()):
                return e
        return None

    return await wait_for(find, within, f"{kind.__name__} {match}")


class ProgressLog:
    """Every progress message of one agent, as published (core subscription)."""

    def __init__(self) -> None:
        self.messages: list[rpc.PullProgress] = []
        self._decoder = msgspec.json.Decoder(rpc.PullProgress)

    async def on_msg(self, msg: Msg) -> None:
        self.messages.append(self._decoder.decode(msg.data))

    def of(self, task_id: str) -> list[rpc.PullProgress]:
        return [m for m in self.messages if m.task_id == task_id]


@asynccontextmanager
async def progress_log(nc: Client, agent_id: str) -> AsyncIterator[ProgressLog]:
    log = ProgressLog()
    sub = await nc.subscribe(f"{subjects.PROGRESS}.{agent_id}.>", cb=log.on_msg)
    try:
        yield log
    finally:
        await sub.unsubscribe()
