"""A large fleet's beats per second stay bounded (domain.beats): the leading manager asks each
agent for a floor under its interval, and judges silence against a deadline that fits it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import pytest

from agent.runtime.dummy import DummyRuntime
from agent.server import AgentServer
from domain import rpc
from domain.beats import pace_floor, silence_deadline
from eventstore.repository import Repository
from eventstore.store import EventStore
from services.manager.agent_rpc import AgentRpc
from services.manager.liveness import LivenessWatcher
from tests.agent.agent_harness import (
    call,
    config,
    count_calls,
    running,
    store_fixture,  # noqa: F401 - the `store` fixture
    wait_for,
    watching,
)
from transport.client import Client


class Clock:
    """A liveness watcher's clock, moved by the test: a deadline passes without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_floor_keeps_the_fleet_within_its_beats_per_second() -> None:
    assert pace_floor(0, 100) == 0 and pace_floor(200, 100) == 0  # fits at 2 s each: no floor
    assert pace_floor(201, 100) == 3.0  # whole seconds, rounded up
    assert pace_floor(1_000, 100) == 10.0 and pace_floor(1_000, 50) == 20.0
    assert pace_floor(10**6, 100) == rpc.MAX_BEAT_FLOOR_S
    with pytest.raises(ValueError, match="beats_per_s"):
        pace_floor(10, 0)
    # Silence is judged after 4 beats at the floor and 5 s, never sooner than the deadline.
    assert silence_deadline(10.0, 15.0) == 45.0
    assert silence_deadline(3.0, 15.0) == 17.0
    assert silence_deadline(0.0, 1.0) == 1.0  # no floor: the manager's deadline as it is


def test_the_floor_comes_down_only_once_the_fleet_is_a_tenth_below_its_step(nc: Client) -> None:
    watcher = LivenessWatcher(nc, None, beats_per_s=100)  # type: ignore[arg-type]  # unused
    watcher.last_seen = {f"a{n}": 0.0 for n in range(201)}
    assert watcher.floor_s() == 3.0
    watcher.marked = {"a0"}  # 200 live: a fleet that fits, but back and forth across 200/201
    assert watcher.floor_s() == 3.0
    watcher.marked = set()
    assert watcher.floor_s() == 3.0
    watcher.marked = {f"a{n}" for n in range(18)}  # 183: 201 with a tenth more, still 3 s
    assert watcher.floor_s() == 3.0
    watcher.marked = {f"a{n}" for n in range(19)}  # 182: 200 with a tenth more, fits
    assert watcher.floor_s() == 0.0
    watcher.last_seen.update({f"b{n}": 0.0 for n in range(1_000)})  # rises at once
    assert watcher.floor_s() == 12.0


def test_a_floor_that_stops_at_its_most_says_so(
    nc: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A --heartbeats-per-second the fleet cannot keep (the floor stops at 60 s) is a warning
    in the manager's log, not silence; a floor that holds is one line of information."""
    watcher = LivenessWatcher(nc, None, beats_per_s=0.5)  # type: ignore[arg-type]  # unused
    watcher.last_seen = {f"a{n}": 0.0 for n in range(40)}
    with caplog.at_level("INFO", logger="services.manager.liveness"):
        assert watcher.floor_s() == rpc.MAX_BEAT_FLOOR_S  # 40 agents would need 80 s
        assert watcher.floor_s() == rpc.MAX_BEAT_FLOOR_S  # said once, not at every look
    [warning] = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "40 agents beat every 60 s: 0.7 heartbeats/s, over --heartbeats-per-second 0.5" in (
        warning.getMessage()
    )
    caplog.clear()
    with caplog.at_level("INFO", logger="services.manager.liveness"):
        watcher.last_seen = {f"a{n}": 0.0 for n in range(20)}  # 40 s: within the budget
        assert watcher.floor_s() == 40.0
    assert [r.getMessage() for r in caplog.records] == [
        "heartbeat floor for 20 agents: 40 s (0: none)"
    ]


async def test_agents_beat_at_the_leaders_floor_and_back_when_the_fleet_fits(
    nc: Client, store: EventStore
) -> None:
    leads = [False]
    watcher = LivenessWatcher(
        nc,
        Repository(store),
        deadline_s=1.0,
        beats_per_s=0.5,  # two agents at most one beat a second: a floor of 4 s
        check_interval_s=0.1,
        acts=lambda: leads[0],
        agents=AgentRpc(nc),
    )
    async with watching(watcher):
        async with (
            running(nc, store, DummyRuntime("p1"), config("p1")) as one,
            running(nc, store, DummyRuntime("p2"), config("p2")) as two,
        ):
            await wait_for(lambda: {"p1", "p2"} <= set(watcher.last_beat), 5, "their beats")
            assert watcher.floor_s() == 4.0 and watcher.silence_deadline_s("p1") == 21.0
            await asyncio.sleep(0.5)
            assert one.pace_s == 0.0, "only the leader tells the pace"

            leads[0] = True
            await wait_for(lambda: one.pace_s == two.pace_s == 4.0, 5, "the floor told")
            assert one.beat_interval_s() == 4.0
            await one.send_heartbeat()
            await wait_for(lambda: watcher.last_beat["p1"].pace_s == 4.0, 5, "the floor beaten")
            beats = count_calls(one.heartbeats, "send")
            await asyncio.sleep(1.5)  # 7 beats at its own 0.2 s
            assert beats[0] <= 1, beats
            # Paced, an agent silent for the manager's own 1 s deadline is not lost.
            assert not watcher.marked and await watcher.check() == []

            # The fleet fits again (a larger budget here): told at its next beat (sent here, not
            # waited for: up to 4 s away), which it answers with one at its own pace.
            watcher.beats_per_s = 100.0
            await one.send_heartbeat()
            await wait_for(lambda: watcher.silence_deadline_s("p1") == 1.0, 10, "floor lifted")
            assert one.pace_s == 0.0 and one.beat_interval_s() == 0.2


async def test_an_agent_is_judged_by_the_floor_its_last_beat_kept_and_beats_at_a_new_one(
    nc: Client, store: EventStore
) -> None:
    # No manager tells a pace here (no agents RPC): the test does, as a manager would.
    clock = Clock()
    async with watching(
        LivenessWatcher(nc, Repository(store), deadline_s=1.0, check_interval_s=0.1, clock=clock)
    ) as watcher:
        async with running(nc, store, DummyRuntime("p4"), config("p4")) as agent:
            assert await call(nc, "p4", rpc.BEAT_PACE, {"floor_s": 3}) == {"interval_s": 3.0}
            await wait_for(lambda: watcher.silence_deadline_s("p4") == 17.0, 5, "3 s kept")
            # The fleet's floor is 0 (one agent): its own 1 s deadline would find it silent
            # 2.5 s after its last beat (of the watcher's time, moved on in steps shorter than
            # a stall of its own, after which it would judge nobody).
            while clock.now - watcher.last_seen["p4"] < 2.5:
                clock.now += 0.25
                assert await watcher.check() == []
            assert "p4" not in watcher.marked and watcher.floor_s() == 0.0

            # A lower floor is beaten at once, not after the 3 s wait under way.
            beats = count_calls(agent.heartbeats, "send")
            assert await call(nc, "p4", rpc.BEAT_PACE, {"floor_s": 0}) == {"interval_s": 0.2}
            await wait_for(lambda: beats[0] >= 1, 1.0, "a beat at the new floor")
            await wait_for(lambda: watcher.silence_deadline_s("p4") == 1.0, 2, "0 kept")


async def test_a_floor_out_of_range_is_refused_naming_the_field(
    nc: Client, store: EventStore
) -> None:
    async with running(nc, store, DummyRuntime("p3"), config("p3")) as agent:
        for bad in (-1, rpc.MAX_BEAT_FLOOR_S + 1, "10"):
            reply = await call(nc, "p3", rpc.BEAT_PACE, {"floor_s": bad})
            assert reply["error"]["code"] == "invalid-request", reply
            assert "floor_s" in reply["error"]["message"], reply
        assert agent.pace_s == 0.0
        assert await call(nc, "p3", rpc.BEAT_PACE, {"floor_s": 3}) == {"interval_s": 3.0}


async def test_agents_paced_at_once_spread_their_beats_over_the_floor(
    nc: Client, store: EventStore
) -> None:
    """A manager paces its whole fleet at once: each agent beats at once (the new floor seen
    kept), then waits a random share of the floor once, so that the fleet's beats do not all
    come in the same instant every floor from then on (1,000 agents did, and every create in
    flight at that instant waited for them).  Never later than the floor: no deadline moves."""
    ids = [f"s{n}" for n in range(12)]
    # Each agent's beats at the new floor (its own 0.2 s beats before it applied it left out)
    beats: dict[str, list[float]] = {a: [] for a in ids}
    async with contextlib.AsyncExitStack() as stack:
        for agent_id in ids:
            agent = await stack.enter_async_context(
                running(nc, store, DummyRuntime(agent_id), config(agent_id))
            )

            async def timed(
                agent: AgentServer = agent,
                times: list[float] = beats[agent_id],
                send: Callable[[], Awaitable[rpc.Heartbeat]] = agent.heartbeats.send,
            ) -> rpc.Heartbeat:
                if agent.pace_s == 1.0:
                    times.append(time.monotonic())
                return await send()

            agent.heartbeats.send = timed  # type: ignore[method-assign]
        paced_at = time.monotonic()
        replies = await asyncio.gather(*(call(nc, a, rpc.BEAT_PACE, {"floor_s": 1}) for a in ids))
        assert all(r == {"interval_s": 1.0} for r in replies)
        await wait_for(lambda: all(len(t) >= 3 for t in beats.values()), 10, "3 beats each")
    after = {a: [t - paced_at for t in times] for a, times in beats.items()}
    firsts = [times[0] for times in after.values()]
    seconds = [times[1] for times in after.values()]
    assert max(firsts) < 0.5, firsts  # at once, each
    assert all(0 < s - f <= 1.05 for f, s in zip(firsts, seconds, strict=True)), (
        after
    )  # within the floor
    assert max(seconds) - min(seconds) > 0.25, seconds  # spread, not together
    thirds = [times[2] - times[1] for times in after.values() if len(times) > 2]
    assert thirds and all(gap > 0.9 for gap in thirds), after  # then the floor itself
