"""The manager's liveness watcher marks a silent agent lost; the agent, back, re-registers."""

from __future__ import annotations

import asyncio

import pytest

from agent import heartbeats
from agent.runtime.dummy import DummyRuntime
from domain import events as ev
from domain.codec import decode
from domain.subjects import liveness_events
from eventstore.repository import Repository
from eventstore.store import EventStore
from services.manager.liveness import LivenessWatcher
from tests.agent.agent_harness import (
    agent_events,
    config,
    count_calls,
    running,
    store_fixture,  # noqa: F401 - the `store` fixture
    wait_for,
    watching,
)
from transport.client import Client


async def test_a_silent_agent_is_marked_lost_and_reregisters_when_back(
    nc: Client, store: EventStore
) -> None:
    clock = Clock()
    async with watching(
        LivenessWatcher(nc, Repository(store), deadline_s=1.0, check_interval_s=0.1, clock=clock)
    ) as watcher:
        async with running(nc, store, DummyRuntime("a1"), config("a1")) as agent:
            await wait_for(lambda: "a1" in watcher.last_beat, 5, "a heartbeat")
            for _ in range(6):  # 1.5 s of the watcher's time, a beat every 0.25 s: not lost
                clock.now += 0.25
                await agent.send_heartbeat()
                await wait_for(lambda: watcher.last_seen["a1"] == clock.now, 5, "the beat")
                assert await watcher.check() == [] and "a1" not in watcher.marked
            assert [type(e) for e in await agent_events(store, "a1")] == [ev.AgentRegistered]

            assert agent._heartbeats is not None
            agent._heartbeats.cancel()  # the agent falls silent (e.g. a partition)
            lost = await _silent_until_lost(store, watcher, clock, "a1")
            assert lost.status_info == "heartbeat-timeout: no heartbeat for 1s"

            # Heard of again: the agent notices it was marked lost and says it is back.
            assert await agent.facts.refresh() is True
            assert await agent.facts.refresh() is False  # once
            events = await agent_events(store, "a1")
            assert [type(e) for e in events[-2:]] == [ev.AgentRegistered, ev.AgentReregistered]
            await agent.send_heartbeat()
            await wait_for(lambda: "a1" not in watcher.marked, 5, "the watch re-armed")


async def test_a_beating_agent_reads_its_liveness_when_it_changes_not_at_every_beat(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heartbeats, "LOOK_EVERY_S", 10.0**6)  # no backstop: only the notice
    watcher = LivenessWatcher(nc, Repository(store), deadline_s=60.0, check_interval_s=60.0)
    cfg = config("a5", heartbeat_interval_s=0.05)
    async with running(nc, store, DummyRuntime("a5"), cfg) as agent:
        reads, beats = count_calls(agent.facts, "refresh"), count_calls(agent.heartbeats, "send")
        await wait_for(lambda: beats[0] >= 10, 10, "10 beats")
        assert reads[0] <= 1, (beats, reads)  # it read at every beat once

        # The manager marks it lost (a partition it could not see) and tells it: the agent
        # reads the subject at its next beat, and says it is back.
        assert await watcher.mark_lost("a5", "a test") is True
        await _reregistered(store, "a5", within=5)


async def test_an_agent_that_missed_the_notice_finds_its_loss_within_a_few_beats(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heartbeats, "LOOK_EVERY_S", 0.6)  # 3 beats at 0.2 s
    watcher = LivenessWatcher(nc, Repository(store), deadline_s=60.0, check_interval_s=60.0)

    async def lost_notice(agent_id: str) -> None:
        pass  # the notice is lost (a core message: at most once)

    watcher._tell = lost_notice  # type: ignore[method-assign]
    async with running(nc, store, DummyRuntime("a6"), config("a6")):
        assert await watcher.mark_lost("a6", "a test") is True
        await _reregistered(store, "a6", within=5)


async def _reregistered(store: EventStore, agent_id: str, within: float) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        kinds = [type(e) for e in await agent_events(store, agent_id)]
        if kinds == [ev.AgentRegistered, ev.AgentReregistered]:
            return
        assert asyncio.get_running_loop().time() < deadline, kinds
        await asyncio.sleep(0.05)


async def test_a_known_agent_that_never_beats_again_is_lost_once(
    nc: Client, store: EventStore
) -> None:
    async with running(nc, store, DummyRuntime("a2"), config("a2")) as agent:
        pass  # registered, then gone for good
    assert agent.first_registration
    async with watching(
        LivenessWatcher(nc, Repository(store), deadline_s=0.3, check_interval_s=0.05),
        known_agents=["a2"],
    ) as watcher:
        await _lost_event(store, "a2", within=5)
        await asyncio.sleep(0.5)
        assert await watcher.check() == []  # one loss is one fact
        kinds = [type(e) for e in await agent_events(store, "a2")]
        assert kinds == [ev.AgentRegistered]  # the loss is on the manager's liveness subject
        assert len(await store.read_subject(liveness_events("a2"))) == 1


async def test_only_a_well_formed_beat_of_the_agent_keeps_it_alive(
    nc: Client, store: EventStore
) -> None:
    # Anything can arrive on a heartbeat subject (nats-server answers a JetStream request on
    # any reply subject a client names): junk, or another agent's beat, proves nothing.
    async with running(nc, store, DummyRuntime("a3"), config("a3")) as agent:
        pass
    assert agent.first_registration
    clock = Clock()
    watcher = LivenessWatcher(
        nc, Repository(store), deadline_s=0.5, check_interval_s=0.05, clock=clock
    )
    heard = count_calls(watcher, "_on_heartbeat")
    async with watching(watcher, known_agents=["a3"]):
        other = (
            b'{"agent_id": "a4", "sent_at": "2026-01-01T00:00:00Z", "kernels": [],'
            b' "free": {"cpu": 1, "mem": 1, "disk": 1}, "images": [], "pulls": {}}'
        )
        for n in range(1, 13):  # beats every 0.1 s of its time, for longer than the deadline
            await nc.publish("hoist.heartbeat.a3", b'{"type": "junk"}')
            await nc.publish("hoist.heartbeat.a3", other)
            await wait_for(lambda n=n: heard[0] >= 2 * n, 5, "the watcher to take them")
            clock.now += 0.1
            await watcher.check()
        lost = await _lost_event(store, "a3", within=1)  # recorded by then
        assert lost.status_info.startswith("heartbeat-timeout")
        assert "a3" not in watcher.last_beat


class Clock:
    """The watcher's clock, moved by the test: its deadlines pass without waiting them out."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _silent_until_lost(
    store: EventStore, watcher: LivenessWatcher, clock: Clock, agent_id: str
) -> ev.AgentLost:
    """Move the watcher's clock on in steps shorter than what it takes for a stall of its own
    (it judges nobody after one) until it records the agent lost; that AgentLost."""
    for _ in range(40):  # 10 s of its time
        if await store.read_subject(liveness_events(agent_id)):
            return await _lost_event(store, agent_id, within=1)
        clock.now += 0.25
        await watcher.check()
    raise AssertionError(f"{agent_id} not marked lost after 10 s of the watcher's time")


async def _lost_event(store: EventStore, agent_id: str, within: float) -> ev.AgentLost:
    """The AgentLost the manager recorded on the agent's liveness subject."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        records = await store.read_subject(liveness_events(agent_id))
        if records:
            event = decode(records[-1].data, records[-1].headers)
            assert isinstance(event, ev.AgentLost)
            return event
        assert asyncio.get_running_loop().time() < deadline, "no AgentLost recorded"
        await asyncio.sleep(0.05)
