"""Several managers: one leads through a lease in the stream (services.manager.leadership),
the others serve commands and queries and take over when it is released or lapses; a leader's
batches carry a fence the log refuses once the lease moved on."""

from __future__ import annotations

import time
from typing import Any

import pytest

from domain import events as ev
from domain.agent import Agent
from domain.codec import encode
from domain.subjects import liveness_events, manager_lease, manager_term, reservation_events
from eventstore.repository import Repository
from eventstore.store import ConcurrencyError, EventStore, Message, Write
from services.manager.agent_sync import AgentSync
from services.manager.leadership import Leadership, NotLeading
from services.manager.liveness import LivenessWatcher
from tests.agent.agent_harness import wait_for
from tests.manager.harness import GB, agents, create, manager
from transport.client import Client


async def test_one_leads_the_other_serves_and_takes_over(nc: Client, store: EventStore) -> None:
    async with agents(nc, store, ["a1"], cpu=4):
        async with manager(nc, manager_id="m2", lease_ttl_s=1.0) as m2:
            async with manager(nc, manager_id="m1", lease_ttl_s=1.0) as m1:
                assert m2.leadership is not None and m1.leadership is not None
                assert m2.leadership.leading and not m1.leadership.leading
                # creates go to either (one queue group); the leader schedules every one
                views = [
                    await create(nc, resources={"cpu": 1, "mem": GB}, max_wait=5) for _ in range(4)
                ]
                assert [v["status"] for v in views] == ["RUNNING"] * 4
                await wait_for(
                    lambda: m1.fleet.sessions.keys() == m2.fleet.sessions.keys(), 5, "same view"
                )
            # m1 stopped: m2 still leads
            assert m2.leadership.leading
        async with manager(nc, manager_id="m1", lease_ttl_s=1.0) as m1:
            # m2 released the lease on stop: m1 took it at once
            assert m1.leadership is not None and m1.leadership.leading
            view = await create(nc, resources={"cpu": 1, "mem": GB // 2}, max_wait=5)
            assert view["status"] == "PENDING"  # the first four hold the agent's 4 cpu


async def test_a_standby_takes_over_when_the_lease_lapses(nc: Client, store: EventStore) -> None:
    async with (
        agents(nc, store, ["a1"], cpu=4),
        manager(nc, manager_id="m2", lease_ttl_s=1.0) as m2,
    ):
        async with manager(nc, manager_id="m1", lease_ttl_s=1.0) as m1:
            assert m2.leadership is not None and m1.leadership is not None
            assert m2.leadership.leading
            await m2.leadership._tasks.stop()  # m2 hangs: it renews no more
            start = time.monotonic()
            await wait_for(lambda: m1.leadership.leading, 5, "m1 to lead")
            assert time.monotonic() - start < 1.0 + 1.0  # within the TTL plus a second
            view = await create(nc, resources={"cpu": 1, "mem": GB}, max_wait=5)
            assert view["status"] == "RUNNING"


async def _nothing() -> None:
    pass


async def _leader(store: EventStore, holder: str = "old", **options: Any) -> Leadership:
    leadership = Leadership(
        store, holder, ttl_s=1.0, on_lead=_nothing, on_follow=_nothing, **options
    )
    await leadership.tick()
    return leadership


async def _taken_over(store: EventStore, old: Leadership) -> None:
    """Another manager takes the lease from ``old`` (as when old's lapsed): the lease and its
    term's record, in one batch, as Leadership takes it."""
    at = ev.ManagerLeaseTaken.create_timestamp()
    lease = ev.ManagerLeaseTaken(
        originator_id="manager", originator_version=1, timestamp=at, holder="new", ttl_s=1.0
    )
    term = ev.ManagerTermBegan(
        originator_id="manager-term", originator_version=1, timestamp=at, holder="new"
    )
    await store.append(
        [
            Write(manager_lease(), [Message(*encode(lease))], expected_last_seq=old.lease_seq),
            Write(manager_term(), [Message(*encode(term))]),
        ]
    )


@pytest.mark.parametrize("messages", [1, 2], ids=["fence stored", "fence riding"])
async def test_a_paused_ex_leaders_fenced_batch_is_refused(
    nc: Client, store: EventStore, messages: int
) -> None:
    await store.ensure_stream()
    old = await _leader(store)
    assert old.leading
    fence = old.fence()
    await _taken_over(store, old)  # the old one's lease lapsed while it was paused
    reservation = Write(reservation_events("a1"), [Message(b"{}")] * messages, expected_last_seq=0)
    with pytest.raises(ConcurrencyError) as refused:
        await store.append([reservation, *fence])
    assert refused.value.subject == manager_term()
    assert await store.last_seq(reservation_events("a1")) == 0  # nothing of the batch stored
    # Without the fence the same write would have gone in: the fence refused it.
    assert len(await store.append([reservation])) == messages


async def test_the_leaders_renewals_refuse_none_of_its_fenced_batches(
    nc: Client, store: EventStore
) -> None:
    """A batch fenced before a renewal goes in after it: fences expect the term's record, which
    only a take writes (when they expected the lease's sequence, every renewal refused the
    leader's batches in flight)."""
    await store.ensure_stream()
    leader = await _leader(store)
    fence = leader.fence()
    taken_at = leader.lease_seq
    await leader.tick()  # a renewal
    assert leader.leading and leader.lease_seq > taken_at
    reservation = Write(reservation_events("a1"), [Message(b"{}")], expected_last_seq=0)
    assert len(await store.append([reservation, *fence])) == 2


async def test_a_record_no_manager_wrote_does_not_block_the_lease(
    nc: Client, store: EventStore
) -> None:
    await store.ensure_stream()
    await store.append([Write(manager_lease(), [Message(b"junk")])])  # no TTL: it stays
    async with manager(nc, manager_id="m1", lease_ttl_s=1.0) as m1:
        assert m1.leadership is not None and m1.leadership.leading


async def _registered(store: EventStore, agent_id: str) -> Repository:
    repo = Repository(store)
    await repo.save(
        Agent.register(
            agent_id=agent_id,
            resource_group="default",
            capacity={"cpu": 4, "mem": GB, "disk": GB},
            runtime="dummy",
            images={},
        )
    )
    return repo


async def test_a_paused_ex_leader_marks_no_agent_lost(nc: Client, store: EventStore) -> None:
    """The bug a hostile trial found: a leader paused past the lease (SIGSTOP), resumed, still
    believed it led and, its heartbeat clock stale, appended AgentLost for healthy agents."""
    await store.ensure_stream()
    repo = await _registered(store, "a1")
    old = await _leader(store)
    assert old.leading
    now = [0.0]
    watcher = LivenessWatcher(
        nc, repo, deadline_s=15.0, clock=lambda: now[0], acts=lambda: old.leading, fence=old.fence
    )
    watcher.last_seen["a1"] = 0.0
    assert await watcher.check() == []  # its first round, all well
    # Paused 27 s: the lease lapsed and another manager took it; nobody beat into this one.
    now[0] = 27.0
    assert await watcher.check() == []  # a stall: nobody judged ...
    assert watcher.last_seen["a1"] == 27.0  # ... every agent gets a deadline from now
    await _taken_over(store, old)
    # Even judged on its stale clock (rounds kept on time), its AgentLost is fenced out.
    for t in range(28, 44):
        now[0] = float(t)
        assert await watcher.check() == []
    assert await store.last(liveness_events("a1")) is None  # no AgentLost stored
    # The fence alone: without it the same loss would have gone in.
    unfenced = LivenessWatcher(nc, repo, deadline_s=15.0, clock=lambda: now[0])
    assert await unfenced.mark_lost("a1", "no heartbeat for 15s")
    assert await store.last(liveness_events("a1")) is not None


async def test_a_manager_that_does_not_lead_gives_no_fence_but_refuses(
    nc: Client, store: EventStore
) -> None:
    await store.ensure_stream()
    await _leader(store, "someone")
    follower = await _leader(store, "f")  # the lease is someone's
    assert not follower.leading
    with pytest.raises(NotLeading):
        follower.fence()  # never an unfenced leader's write
    unfenced = Leadership(
        store, "u", ttl_s=1.0, on_lead=_nothing, on_follow=_nothing, fencing=False
    )
    assert unfenced.fence() == ()


async def test_a_record_reflected_onto_the_lease_does_not_unseat_the_leader(
    nc: Client, store: EventStore
) -> None:
    """Any reader can make nats-server store its answer on the lease subject (a direct get
    with that reply subject): the leader's next renewal is refused, and it renews over the
    record instead of stepping down (a trial flipped leadership 64 times in 22 s so)."""
    await store.ensure_stream()
    leader = await _leader(store)
    assert leader.leading
    [junk] = await store.append([Write(manager_lease(), [Message(b'{"type":"io.nats..."}')])])
    await leader.tick()
    assert leader.leading and leader.lease_seq > junk
    assert leader.changes == 1  # it took the lead once, and never lost it


async def test_a_refused_renewal_whose_lease_is_still_ours_keeps_the_lead(
    nc: Client, store: EventStore
) -> None:
    await store.ensure_stream()
    leader = await _leader(store)
    held = leader.lease_seq
    leader.lease_seq = held - 1  # as if a renewal cancelled after it was sent had landed
    await leader.tick()
    assert leader.leading and leader.lease_seq == held


async def test_a_record_reflected_onto_the_term_is_begun_over(
    nc: Client, store: EventStore
) -> None:
    """A record no manager wrote on the term subject would refuse every fenced write; the
    leader's next renewal begins the term again over it."""
    await store.ensure_stream()
    leader = await _leader(store)
    [junk] = await store.append([Write(manager_term(), [Message(b'{"type":"io.nats..."}')])])
    reservation = Write(reservation_events("a1"), [Message(b"{}")], expected_last_seq=0)
    with pytest.raises(ConcurrencyError):
        await store.append([reservation, *leader.fence()])  # refused while the junk is last
    await leader.tick()  # a renewal, which looks at the term
    assert leader.leading and leader.term_seq > junk
    assert len(await store.append([reservation, *leader.fence()])) == 2


async def test_a_lease_taken_back_over_a_reflected_record_begins_a_new_term(
    nc: Client, store: EventStore
) -> None:
    """Found by a review: A paused, B took over a reflected record, another reflection let A
    take the lease back by renewing over it; A then led with B's term last, so every fenced
    write of A was refused for ever while B followed.  Taking over such a record, or finding
    another's term while the lease is ours, begins a new term."""
    await store.ensure_stream()
    a = await _leader(store, "a")
    junk = Message(b'{"type":"io.nats..."}')
    await store.append([Write(manager_lease(), [junk])])  # a reflection
    b = await _leader(store, "b")  # B takes over the record no manager wrote
    assert b.leading
    await store.append([Write(manager_lease(), [junk])])  # another, before A renews
    for leadership in (a, b, a, b, a):
        await leadership.tick()
    assert a.leading and not b.leading
    last = await store.last(manager_term())
    assert last is not None and a.term_seq == last.seq
    reservation = Write(reservation_events("a1"), [Message(b"{}")], expected_last_seq=0)
    assert len(await store.append([reservation, *a.fence()])) == 2


async def test_a_paused_ex_leader_syncs_no_agent(nc: Client, store: EventStore) -> None:
    """A sync destroys what the view does not know and no fence stops an RPC to an agent: a
    leader paused past three quarters of its lease (its successor's kernels unknown to its old
    view) syncs nothing until a renewal says it still leads."""
    await store.ensure_stream()
    now = [0.0]
    old = await _leader(store, clock=lambda: now[0])
    assert old.leading and old.assured

    class NoCalls:
        async def call(self, *args: object, **kwargs: object) -> object:
            raise AssertionError("an agent was called")

    sync = AgentSync(None, None, NoCalls(), None, assured=lambda: old.assured)  # type: ignore[arg-type]
    now[0] = 0.8  # paused: the lease (1 s) may have lapsed, and another manager lead since
    assert old.leading and not old.assured
    reply = await sync.sync("a1")
    assert "lease was not renewed in time" in reply["error"] and sync.syncs == 0
    assert await sync.reconcile() == []  # nor a reconciliation round (pins, syncs)
    await old.tick()  # renewed (nobody took it here): it leads, assured again
    assert old.assured
    async with agents(nc, store, ["a1"]), manager(nc) as m:
        assert m.sync.assured()  # the manager's wiring: its own leadership
