"""Reservations (domain.reservation): each SessionScheduled goes in one atomic batch with its
agents' reservations, each expecting its subject's last sequence, and ended kernels are
released on the same subjects; two managers scheduling at once never book the same room."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from domain.codec import TYPE_HEADER
from domain.session import Session
from domain.subjects import SESSION_CREATE, SESSION_DESTROY, reservation_events
from eventstore.repository import Repository
from eventstore.store import EventStore
from services.manager import scheduler_loop
from tests.agent.agent_harness import wait_for
from tests.manager.booking_check import overbooked
from tests.manager.harness import GB, agents, create, create_payload, manager, request, until
from transport.client import Client


async def test_reserved_with_the_schedule_and_released_when_ended(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"], cpu=2), manager(nc) as m:
        first = await create(nc, resources={"cpu": 2, "mem": GB}, max_wait=5)
        assert first["status"] == "RUNNING"
        records = await store.read_subject(reservation_events("a1"))
        assert [r.headers[TYPE_HEADER] for r in records] == ["CapacityReserved"]
        history = await store.read_subject(f"hoist.events.session.{first['session_id']}")
        types = [r.headers[TYPE_HEADER] for r in history]
        assert types[:4] == [
            "SessionEnqueued", "SessionScheduled", "KernelPrepared", "KernelCreating"
        ]  # fmt: skip
        # one atomic batch: the same batch id on the schedule, its kernel's PREPARED (a1
        # holds the image) and CREATING (no appends of their own) and the reservation
        batch = records[0].headers["Nats-Batch-Id"]
        assert [r.headers.get("Nats-Batch-Id") for r in history[1:4]] == [batch] * 3
        second = await create(nc, resources={"cpu": 1, "mem": GB}, max_wait=0.3)
        assert second["status"] == "PENDING"
        await request(nc, SESSION_DESTROY, {"session_id": first["session_id"]})
        assert (await until(nc, second["session_id"]))["status"] == "RUNNING"
        types = [r.headers[TYPE_HEADER] for r in await store.read_subject(reservation_events("a1"))]
        assert types == ["CapacityReserved", "CapacityReleased", "CapacityReserved"]
        held = m.fleet.reservations.by_agent["a1"].held
        assert set(held) == {k["kernel_id"] for k in second["kernels"]}
    assert (await overbooked(store))[0] == []


@pytest.mark.parametrize(("image", "passes"), [("base:1", 10), ("py:3", 4)])
async def test_a_pass_never_puts_more_in_its_batch_than_a_batch_holds(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch, image: str, passes: int
) -> None:
    """A placed session costs its batch a SessionScheduled, a KernelPreparing per kernel (or,
    its agents holding the image, base:1, a KernelPrepared and a KernelCreating) and a
    CapacityReserved per agent (plus the pass's fence): with room for 12 messages, ten
    three-kernel sessions created at once go in several passes (one a pass holding the
    image, at most two else), every batch within 12, and every session is placed."""
    monkeypatch.setattr(scheduler_loop, "MAX_BATCH", 12)
    async with agents(nc, store, ["a1", "a2", "a3"], cpu=16, mem=64 * GB), manager(nc):
        payload = create_payload(cluster_size=3, cluster_mode="multi-node", image=image)
        created = await asyncio.gather(*(request(nc, SESSION_CREATE, payload) for _ in range(10)))
        for reply in created:
            assert (await until(nc, reply["session_id"]))["status"] == "RUNNING", reply
        records = await store.read(1, 10_000)
        batches = Counter(
            r.headers["Nats-Batch-Id"] for r in records if "Nats-Batch-Id" in r.headers
        )
        scheduling = [
            n
            for batch, n in batches.items()
            if any(
                r.headers.get("Nats-Batch-Id") == batch
                and r.headers[TYPE_HEADER] == "SessionScheduled"
                for r in records
            )
        ]
        assert len(scheduling) >= passes, batches  # (1 + 6 or 3 + 1..3) + the fence
        assert max(scheduling) <= 12, batches
    assert (await overbooked(store))[0] == []


async def test_two_managers_scheduling_at_once_never_double_book(
    nc: Client, store: EventStore
) -> None:
    """Both managers run their schedulers (no lease: the OCC alone): 120 creates on 10
    slots; exactly 10 sessions hold room at any time and the log never over-books."""
    ids = [f"a{i}" for i in range(5)]
    async with (
        agents(nc, store, ids, cpu=2, mem=64 * GB),
        manager(nc, lease_ttl_s=None) as m1,  # no lease: both lead
        manager(nc, lease_ttl_s=None) as m2,
    ):
        payloads = [
            create_payload(owner=f"u{i % 5}", resources={"cpu": 1, "mem": GB}, max_wait=5)
            for i in range(120)
        ]
        replies = await asyncio.gather(
            *(request(nc, SESSION_CREATE, p, within=30) for p in payloads)
        )
        assert all("error" not in r for r in replies), replies[:3]
        by_status = Counter(r["status"] for r in replies)
        assert by_status["RUNNING"] == 10, by_status
        # destroy the running ones: the others move in, still never over capacity
        running = [r["session_id"] for r in replies if r["status"] == "RUNNING"]
        for sid in running:
            await request(nc, SESSION_DESTROY, {"session_id": sid})

        def ten_more() -> bool:
            return (
                sum(
                    1
                    for s in m1.fleet.sessions.values()
                    if s.status.value == "RUNNING" and s.id not in running
                )
                == 10
            )

        await wait_for(ten_more, 20, "ten more sessions running")
        assert m1.fleet.reservations.extra("a0") == m2.fleet.reservations.extra("a0")
    problems, counts = await overbooked(store)
    assert problems == []
    assert counts["reserved"] >= 20 and counts["released"] >= 10, counts


async def test_a_log_from_before_reservations_still_counts_its_kernels(
    nc: Client, store: EventStore
) -> None:
    """A session scheduled before reservations existed (no CapacityReserved) still occupies
    its agent: the view counts the union of the sessions' and the reservations' accounts."""
    async with agents(nc, store, ["a1"], cpu=2):
        old = Session.enqueue(
            owner="alice", image="base:1", resources={"cpu": 2, "mem": GB}, resource_group="default"
        )
        old.schedule({k: "a1" for k in old.kernels}, "scheduled")
        await Repository(store).save(old)  # as Hoist wrote it before issue 17
        async with manager(nc) as m:
            waiting = await create(nc, resources={"cpu": 1, "mem": GB}, max_wait=0.5)
            assert waiting["status"] == "PENDING", waiting
            assert m.fleet.view_of("a1").reserved_cpu == 2.0
            await request(nc, SESSION_DESTROY, {"session_id": old.id})
            assert (await until(nc, waiting["session_id"]))["status"] == "RUNNING"
            records = await store.read_subject(reservation_events("a1"))
            # only the new session's reservation: the old kernel never held one to release
            assert [r.headers[TYPE_HEADER] for r in records] == ["CapacityReserved"]
    assert (await overbooked(store))[0] == []
