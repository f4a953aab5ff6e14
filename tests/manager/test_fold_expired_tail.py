"""The manager's start-up fold ends at the log's end as it was at start, even when the records
there expired before the fold reached them (a released lease's TTL lapsing during a long fold:
at 20,000 live sessions a restarted lone manager waited for ever for a record that was gone)."""

from __future__ import annotations

import asyncio

from domain.agent import Agent
from domain.subjects import manager_lease
from services.eventstore.repository import Repository
from services.eventstore.store import EventStore
from services.manager.fleet import Fleet
from services.manager.leadership import Leadership
from services.transport.client import Client
from tests.agent.agent_harness import wait_for


async def _nothing() -> None:
    pass


async def test_the_fold_ends_where_the_logs_last_records_expired(
    nc: Client, store: EventStore
) -> None:
    repository = Repository(store, actor="manager")
    agent = Agent.register(
        agent_id="a1",
        resource_group="rg",
        capacity={"cpu": 4, "mem": 1 << 30, "disk": 1 << 34},
        runtime="dummy",
    )
    await repository.save(agent)
    lease = Leadership(store, "m1", ttl_s=1.0, on_lead=_nothing, on_follow=_nothing)
    await lease.tick()  # the log's last record: a lease that lapses after 1 s
    assert lease.leading
    head = await store.head()
    for _ in range(100):  # nats-server removes an expired message within about a second
        if await store.last(manager_lease(), expiring=True) is None:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the lease did not expire within 10 s")

    fleet = Fleet(store, repository)
    try:
        async with asyncio.timeout(5):
            await fleet.start()
        assert fleet.last_seq == head  # the gap at the end counts as read
        assert "a1" in fleet.agents
        # and it follows on from there
        later = Agent.register(
            agent_id="a2",
            resource_group="rg",
            capacity={"cpu": 4, "mem": 1 << 30, "disk": 1 << 34},
            runtime="dummy",
        )
        await repository.save(later)
        await wait_for(lambda: "a2" in fleet.agents, 5, "the follower to fold a2")
    finally:
        await fleet.stop()
