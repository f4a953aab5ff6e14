"""The scheduler reactor with real agents: predicates, strategies, locality, no over-commit."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from domain import rpc
from domain.codec import TYPE_HEADER
from domain.scheduling import Limits, PendingSession, Policy, plan
from domain.subjects import SESSION_CREATE, SESSION_DESTROY, session_events
from eventstore.store import EventStore
from tests.agent.agent_harness import wait_for
from tests.manager.harness import (
    GB,
    agents,
    create,
    create_payload,
    get,
    manager,
    request,
    until,
)
from transport.client import Client


async def test_owner_limit_keeps_the_second_pending_until_the_first_ends(
    nc: Client, store: EventStore
) -> None:
    limits = Limits(max_sessions_per_owner=1)
    async with agents(nc, store, ["a1"]), manager(nc, limits=limits):
        first = await create(nc, max_wait=5)
        assert first["status"] == "RUNNING"
        second = await create(nc, max_wait=0.3)
        assert second["status"] == "PENDING"
        assert second["status_info"].startswith("predicate-checks-failed: max_sessions_per_owner")
        other_owner = await create(nc, owner="bob", max_wait=5)
        assert other_owner["status"] == "RUNNING"
        await request(nc, SESSION_DESTROY, {"session_id": first["session_id"]})
        assert (await until(nc, second["session_id"]))["status"] == "RUNNING"


async def test_per_session_resource_limits_name_the_predicate(
    nc: Client, store: EventStore
) -> None:
    limits = Limits(max_cpu_per_session=3, max_cluster_size=4)
    async with agents(nc, store, ["a1", "a2"]), manager(nc, limits=limits):
        big = await create(nc, cluster_size=2, resources={"cpu": 2, "mem": GB}, max_wait=0.3)
        assert big["status"] == "PENDING"
        assert big["status_info"] == (
            "predicate-checks-failed: max_cpu_per_session (4 cpu asked, limit 3)"
        )
        small = await create(nc, cluster_size=3, max_wait=5)
        assert small["status"] == "RUNNING"


async def _placements(nc: Client, n: int) -> Counter[str]:
    placed: Counter[str] = Counter()
    for _ in range(n):
        s = await create(nc, max_wait=5)
        assert s["status"] == "RUNNING", s
        placed[s["kernels"][0]["agent_id"]] += 1
    return placed


async def test_concentrated_fills_one_agent_first(nc: Client, store: EventStore) -> None:
    policy = Policy(strategy="concentrated")
    async with agents(nc, store, ["a1", "a2", "a3"]), manager(nc, policy=policy):
        assert await _placements(nc, 4) == {"a1": 4}  # 4 cpu each: a1 is full now
        assert await _placements(nc, 1) == {"a2": 1}


async def test_dispersed_spreads_over_agents(nc: Client, store: EventStore) -> None:
    policy = Policy(strategy="dispersed")
    async with agents(nc, store, ["a1", "a2", "a3"]), manager(nc, policy=policy):
        assert await _placements(nc, 3) == {"a1": 1, "a2": 1, "a3": 1}


async def test_image_locality_prefers_holders_without_piling_onto_them(
    nc: Client, store: EventStore
) -> None:
    sizes = {"big:1": 2 * GB}
    async with (
        agents(nc, store, ["a1", "a2", "a3"], image_sizes=sizes) as running,
        manager(nc, policy=Policy(strategy="dispersed")) as m,
    ):
        # a2 pulls the big image; the manager learns it from ImagePulled.
        await running["a2"].image_verbs.check_and_pull(rpc.CheckAndPull(images=["big:1"]))
        await wait_for(
            lambda: "docker.io/library/big:1" in m.fleet.agents["a2"].agent.images,
            10,
            "ImagePulled",
        )
        half = {"cpu": 2, "mem": 4 * GB}  # half an agent: more than the locality bonus
        first = await create(nc, image="big:1", resources=half, max_wait=5)
        assert first["kernels"][0]["agent_id"] == "a2", first  # locality wins among idle agents
        second = await create(nc, image="big:1", resources=half, max_wait=5)
        # a2 is now busier than the bonus is worth: the next one pulls elsewhere.
        assert second["kernels"][0]["agent_id"] != "a2", second
        assert second["status"] == "RUNNING"


async def test_no_room_waits_and_runs_when_room_frees(nc: Client, store: EventStore) -> None:
    async with agents(nc, store, ["a1"], cpu=2), manager(nc):
        first = await create(nc, resources={"cpu": 2, "mem": GB}, max_wait=5)
        assert first["status"] == "RUNNING"
        second = await create(nc, resources={"cpu": 1, "mem": GB}, max_wait=0.3)
        assert second["status"] == "PENDING"
        assert second["status_info"].startswith("no-available-instances")
        await request(nc, SESSION_DESTROY, {"session_id": first["session_id"]})
        assert (await until(nc, second["session_id"]))["status"] == "RUNNING"


async def test_200_concurrent_creates_never_over_commit(nc: Client, store: EventStore) -> None:
    ids = [f"a{i}" for i in range(5)]
    async with agents(nc, store, ids, cpu=4, mem=64 * GB) as running, manager(nc) as m:
        payloads = [
            create_payload(owner=f"u{i % 7}", resources={"cpu": 1, "mem": GB}, max_wait=5)
            for i in range(200)
        ]
        replies = await asyncio.gather(
            *(request(nc, SESSION_CREATE, p, within=30) for p in payloads)
        )
        by_status = Counter(r["status"] for r in replies)
        assert by_status == {"RUNNING": 20, "PENDING": 180}, by_status
        assert all(
            r["status_info"].startswith("no-available-instances")
            for r in replies
            if r["status"] == "PENDING"
        )
        for agent_id, agent in running.items():
            assert len(agent.runtime.kernels) == 4, agent_id
            view = m.fleet.agents[agent_id]
            assert (view.reserved_cpu, view.reserved_mem) == (4, 4 * GB)


async def test_a_pass_that_raises_on_one_session_records_why_and_places_the_others(
    nc: Client, store: EventStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A plan that raises is made again one session at a time: the session whose own plan
    raises waits with ``scheduler-error: <type: text>``, recorded once however many passes
    meet it again, and the other sessions of those passes are placed."""

    def planner(pending: list[PendingSession], *args: Any, **kwargs: Any) -> Any:
        if any(s.owner == "carol" for s in pending):
            raise KeyError("no view of agent 'a9'")
        return plan(pending, *args, **kwargs)

    def carols_reason(s: dict[str, Any]) -> bool:
        return s["status_info"].startswith("scheduler-error:")

    async with agents(nc, store, ["a1"]), manager(nc, planner) as m:
        carol = await create(nc, owner="carol")
        failed = await until(nc, carol["session_id"], carols_reason, what="has its reason")
        assert failed["status"] == "PENDING"
        assert failed["status_info"] == "scheduler-error: KeyError: \"no view of agent 'a9'\""
        assert {k["status_info"] for k in failed["kernels"]} == {failed["status_info"]}
        passes = m.scheduler.passes
        alice = await create(nc, max_wait=5)  # planned in a pass with carol's session
        assert alice["status"] == "RUNNING", alice
        bob = await create(nc, owner="bob", max_wait=5)
        assert bob["status"] == "RUNNING", bob
        assert m.scheduler.passes >= passes + 2
        again = await get(nc, carol["session_id"])
        assert again["status_info"] == failed["status_info"] and again["status"] == "PENDING"
        records = await store.read_subject(session_events(carol["session_id"]))
        kinds = [r.headers[TYPE_HEADER] for r in records]
        assert kinds == ["SessionEnqueued", "SessionSchedulingFailed"]  # once, not each pass
        raised = [r for r in caplog.records if "the scheduler raised" in r.getMessage()]
        assert len(raised) == 1 and raised[0].exc_info is not None
