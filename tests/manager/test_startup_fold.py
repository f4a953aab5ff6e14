"""The manager's start-up fold: it ends at the log's end as it was at start, even when the
records there expired before the fold reached them (a released lease's TTL lapsing during a
long fold: at 20,000 live sessions a restarted lone manager waited for ever for a record that
was gone); a long one goes through the bulk reader's child; and what it defers to its end (the
sessions' indexes, the agents' reservation surpluses) ends as a fold that counted them at every
record."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from domain.agent import Agent
from domain.reasons import Reason, reason_of
from domain.status import KernelStatus as S
from domain.subjects import SESSION_DESTROY, manager_lease
from eventstore.repository import Repository
from eventstore.store import EventStore
from services.manager import fleet_view as fleet_module
from services.manager.fleet import Fleet
from services.manager.leadership import Leadership
from services.stack.natsserver import NatsServer
from tests.agent.agent_harness import wait_for
from tests.manager.harness import GB, agents, create, manager, request
from tests.projections.test_bulk_read import CountingBulk
from transport.client import Client


async def _nothing() -> None:
    pass


def _agent(agent_id: str) -> Agent:
    capacity = {"cpu": 4, "mem": 1 << 30, "disk": 1 << 34}
    return Agent.register(
        agent_id=agent_id, resource_group="rg", capacity=capacity, runtime="dummy"
    )


async def test_the_fold_ends_where_the_logs_last_records_expired(
    nc: Client, store: EventStore
) -> None:
    repository = Repository(store, actor="manager")
    await repository.save(_agent("a1"))
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
        await repository.save(_agent("a2"))
        await wait_for(lambda: "a2" in fleet.agents, 5, "the follower to fold a2")
    finally:
        await fleet.stop()


def _derived(fleet: Fleet) -> dict[str, Any]:
    """What a fold derives beyond the aggregates: room, surpluses, queues, per-owner counts."""
    return {
        "room": {
            a: (s.reserved_cpu, s.reserved_mem, dict(s.reserved_slots))
            for a, s in sorted(fleet.agents.items())
        },
        "extra": {a: fleet.reservations.extra(a) for a in sorted(fleet.agents)},
        "pending": sorted(fleet.pending, key=fleet.pending.__getitem__),  # the queue's order
        "owners": {o: n for o, n in fleet.owner_sessions.items() if n},
        "live_on": {a: sorted(s) for a, s in fleet.live_on_agent.items() if s},
        "statuses": {
            sid: [k.status for k in s.kernels.values()] for sid, s in fleet.sessions.items()
        },
    }


async def test_a_bulk_read_deferred_fold_ends_as_a_fold_counting_at_every_record(
    nats_server: NatsServer, nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with agents(nc, store, ["a1", "a2"], cpu=4), manager(nc) as m:
        views = [await create(nc, resources={"cpu": 1, "mem": GB}, max_wait=5) for _ in range(7)]
        assert [v["status"] for v in views].count("RUNNING") == 7  # 8 cpu: 7 fit
        for v in views[:3]:
            reply = await request(nc, SESSION_DESTROY, {"session_id": v["session_id"]})
            assert "error" not in reply, reply
        waiting = [
            (await create(nc, resources={"cpu": cpu, "mem": GB}, max_wait=0))["session_id"]
            for cpu in (3, 3.5, 2.5)  # 2 cpu free on each agent: these wait, PENDING, in order
        ]
        # The log holds still from its head once, folded to there, the destroyed kernels
        # ended, the pass that released their room is in, and so is each waiting session's
        # scheduling failure (the manager's view has each change before the log does).
        destroyed = [v["session_id"] for v in views[:3]]

        def refused(fleet: Fleet, sid: str) -> bool:
            session = fleet.sessions.get(sid)
            return session is not None and all(
                reason_of(k.status_history[-1].status_info) == Reason.NO_AVAILABLE_INSTANCES
                for k in session.kernels.values()
            )

        async def settled_head() -> int | None:
            head = await store.head()
            fleet = Fleet(store, Repository(store))
            async for rec in store.replay(until_seq=head):
                fleet.fold(rec)
            done = (
                all(fleet.sessions[sid].status is S.TERMINATED for sid in destroyed)
                and not fleet.reservations.due()
                and all(refused(fleet, sid) for sid in waiting)
            )
            return head if done else None

        head = await wait_for(settled_head, 10, "the log to hold still")
        await wait_for(lambda: m.fleet.last_seq >= head, 5, "the manager to fold all")
        live = _derived(m.fleet)

        monkeypatch.setattr(fleet_module, "BULK_MIN", 1)
        bulk = CountingBulk(nats_server.url)
        deferred = Fleet(store, Repository(store), bulk=bulk)
        await deferred.start()
        try:
            assert deferred.last_seq == head and bulk.stretches == [(1, head)]  # all in the child
            # counted at every record, as the start-up fold did before it deferred
            counted = Fleet(store, Repository(store))
            async for rec in store.replay(until_seq=head):
                counted.fold(rec)
            assert _derived(deferred) == _derived(counted) == live
            assert len(live["pending"]) == 3 and live["live_on"]  # the comparison saw something
        finally:
            await deferred.stop()
