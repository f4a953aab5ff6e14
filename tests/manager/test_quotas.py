"""Resource policies and per-user quotas on a real nats-server: a PULLING kernel is not charged
(seed 000), a session over quota waits PENDING and starts when room frees, a session that could
never fit is refused at create, max_lifetime_s and idle_timeout_s end interactive sessions, and
the policies are events in the log."""

from __future__ import annotations

import asyncio
from typing import Any

from domain import subjects
from domain.codec import TYPE_HEADER
from domain.status import KernelStatus
from domain.subjects import (
    QUOTA_REMOVE,
    QUOTA_SET,
    QUOTA_SHOW,
    SESSION_CREATE,
    SESSION_DESTROY,
    SESSION_GET,
    SESSION_LOGS,
    STREAM_READ,
)
from eventstore.store import EventStore
from services.manager.main import Manager
from tests.manager.harness import GB, MB, agents, create, create_payload, manager, request, until
from transport.client import Client

SLOW = {"bandwidth_bps": 1 * MB, "default_size": 40 * MB, "tick_s": 0.05}  # 40 s pulls


async def set_quota(nc: Client, **fields: Any) -> dict[str, Any]:
    reply = await request(nc, QUOTA_SET, fields)
    assert "error" not in reply, reply
    return reply  # type: ignore[no-any-return]


async def destroy(nc: Client, session_id: str) -> None:
    reply = await request(nc, SESSION_DESTROY, {"session_id": session_id})
    assert "error" not in reply, reply


def status(want: str) -> Any:
    return lambda s: s["status"] == want


async def test_a_user_at_quota_has_a_session_pulling_while_another_runs(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"], cpu=8, **SLOW), manager(nc) as m:
        await set_quota(nc, name="alice", max_cpu=1)
        pulling = await create(nc, image="big:1")  # a 40 s pull: charged nothing meanwhile
        await until(nc, pulling["session_id"], status("PULLING"), what="pulling")
        running = await create(nc)  # base:1 is on the agent
        await until(nc, running["session_id"], status("RUNNING"), what="running")
        assert (await until(nc, pulling["session_id"], status("PULLING")))["status"] == "PULLING"
        usage = m.fleet.owner_usage["alice"]
        # cpu: the running one only; sessions: both (a pulling session is still a session,
        # so pulls ending cannot take an owner past their sessions quota)
        assert (usage.cpu, usage.sessions) == (1.0, 2)

        waiting = await create(nc)  # at quota: stays PENDING, with the numbers
        view = await until(
            nc,
            waiting["session_id"],
            lambda s: s["status_info"].startswith("predicate-checks-failed"),
            what="refused by the quota",
        )
        assert view["status"] == "PENDING"
        assert view["status_info"] == (
            "predicate-checks-failed: user cpu quota (1.0 of 1.0 used, asks 1.0)"
        )
        shown = await request(nc, QUOTA_SHOW, {"owner": "alice"})
        (row,) = shown["owners"]
        assert row["policy"] == "alice" and row["quota"]["max_cpu"] == 1.0
        assert row["usage"]["cpu"] == 1.0 and row["pending"] == 1

        await destroy(nc, running["session_id"])  # room frees: the waiting one starts
        await until(nc, waiting["session_id"], status("RUNNING"), what="started")
        await until(nc, pulling["session_id"], status("PULLING"))  # still not charged
        for s in (pulling, waiting):
            await destroy(nc, s["session_id"])

        # With a sessions quota, a pulling session counts: no number of sessions pulling at
        # once can each start past it when their pulls end.
        await set_quota(nc, name="alice", max_sessions=1)
        first = await create(nc, image="big:1")
        await until(nc, first["session_id"], status("PULLING"), what="pulling")
        second = await create(nc, image="big:1")
        view = await until(
            nc,
            second["session_id"],
            lambda s: s["status_info"].startswith("predicate-checks-failed"),
            what="held by the sessions quota",
        )
        assert view["status_info"] == (
            "predicate-checks-failed: user sessions quota (1 of 1 used, asks 1)"
        ), view


async def test_each_limit_keeps_a_session_pending_and_the_default_policy_applies(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"], cpu=8), manager(nc):
        await set_quota(nc, name="default", max_sessions=1, max_mem=600 * MB)
        big = await request(nc, SESSION_CREATE, create_payload(resources={"cpu": 1, "mem": GB}))
        assert big["error"]["code"] == "invalid-request"
        assert "resource policy 'default'" in big["error"]["message"]
        first = await create(nc, owner="bob")
        await until(nc, first["session_id"], status("RUNNING"))
        second = await create(nc, owner="bob")
        view = await until(
            nc, second["session_id"], lambda s: "quota" in s["status_info"], what="waits"
        )
        assert view["status_info"] == (
            "predicate-checks-failed: user sessions quota (1 of 1 used, asks 1)"
        )
        other = await create(nc, owner="carol")  # another owner, its own usage
        await until(nc, other["session_id"], status("RUNNING"))
        await destroy(nc, first["session_id"])
        await until(nc, second["session_id"], status("RUNNING"))


async def test_a_session_that_could_never_fit_its_quota_is_refused_at_create(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"], cpu=8), manager(nc) as m:
        await set_quota(
            nc, name="alice", max_cpu=4, max_mem=GB, max_slots={"gpu": 1}, max_kernels_per_session=2
        )
        before = await store.last_seq(f"{subjects.EVENTS}.session.>")
        cases = {
            "cluster_size": create_payload(cluster_size=3),
            "resources.cpu": create_payload(resources={"cpu": 3, "mem": 8 * MB}, cluster_size=2),
            "resources.mem": create_payload(resources={"cpu": 1, "mem": 2 * GB}),
            "resources.gpu": create_payload(resources={"cpu": 1, "mem": 8 * MB, "gpu": 2}),
        }
        for field, payload in cases.items():
            reply = await request(nc, SESSION_CREATE, payload)
            assert reply["error"]["code"] == "invalid-request", (field, reply)
            assert reply["error"]["message"].startswith(f"{field}: "), (field, reply)
            assert "resource policy 'alice'" in reply["error"]["message"]
        assert await store.last_seq(f"{subjects.EVENTS}.session.>") == before
        assert not m.fleet.sessions
        ok = await create(nc, resources={"cpu": 2, "mem": 64 * MB}, cluster_size=2)  # just fits
        await until(nc, ok["session_id"], status("RUNNING"))


async def test_an_interactive_session_past_its_lifetime_is_terminated(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"], cpu=8), manager(nc, lifetime_check_interval_s=0.1):
        await set_quota(nc, name="default", max_lifetime_s=1)
        await set_quota(nc, name="bob")  # bob's own policy: no lifetime
        alice = await create(nc)
        bob = await create(nc, owner="bob")
        await until(nc, bob["session_id"], status("RUNNING"))
        done = await until(nc, alice["session_id"], lambda s: s["status"] == "TERMINATED")
        assert done["status_info"] == "lifetime-exceeded: ran longer than 1s", done
        assert (await until(nc, bob["session_id"]))["status"] == "RUNNING"
        await destroy(nc, bob["session_id"])


async def ended_unread(m: Manager, session_id: str, within_s: float = 15) -> None:
    for _ in range(int(within_s / 0.05)):
        if m.fleet.sessions[session_id].status is KernelStatus.TERMINATED:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"session {session_id} not TERMINATED after {within_s}s")


async def test_an_interactive_session_nobody_uses_is_ended_idle_timeout(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"], cpu=8), manager(nc, lifetime_check_interval_s=0.1) as m:
        await set_quota(nc, name="default", idle_timeout_s=1)
        idle = await create(nc)
        kept = await create(nc)
        batch = await create(nc, session_type="batch", command=["sleep", "5"])
        for sid in (idle["session_id"], kept["session_id"], batch["session_id"]):
            await until(nc, sid, status("RUNNING"))
        # kept: read through Hoist every 0.3 s (gets, and a logs stream read), for 2.5 s
        opened = await request(nc, SESSION_LOGS, {"session_id": kept["session_id"]})
        assert "error" not in opened, opened
        read = {"agent_id": opened["agent_id"], "stream_id": opened["stream_id"], "wait": 0}
        for i in range(8):
            if i % 2:
                chunk = await request(nc, STREAM_READ, read)
                assert "error" not in chunk, chunk
            else:
                view = await request(nc, SESSION_GET, {"session_id": kept["session_id"]})
                assert view["status"] == "RUNNING", view
            await asyncio.sleep(0.3)
        await ended_unread(m, idle["session_id"])  # session.get would be a use: ask the fleet
        done = await request(nc, SESSION_GET, {"session_id": idle["session_id"]})
        assert done["status_info"] == "idle-timeout: not used for 1s", done
        assert (await request(nc, SESSION_GET, {"session_id": kept["session_id"]}))[
            "status"
        ] == "RUNNING"
        assert (await request(nc, SESSION_GET, {"session_id": batch["session_id"]}))[
            "status"
        ] == "RUNNING"  # batch sessions are never idle-ended
        assert m.quotas.idle_ended == 1
        # left alone, kept goes idle too
        await ended_unread(m, kept["session_id"])
        done = await request(nc, SESSION_GET, {"session_id": kept["session_id"]})
        assert done["status_info"].startswith("idle-timeout"), done
        await destroy(nc, batch["session_id"])


async def test_policy_set_and_remove_are_events_in_the_log(nc: Client, store: EventStore) -> None:
    async with manager(nc) as m:
        first = await set_quota(nc, name="alice", max_cpu=2, max_slots={"gpu": 1})
        assert first["recorded"] and first["policy"]["max_slots"] == {"gpu": 1.0}
        again = await set_quota(nc, name="alice", max_cpu=2, max_slots={"gpu": 1})
        assert not again["recorded"]  # the same policy: nothing new
        await set_quota(nc, name="alice", max_cpu=3)
        removed = await request(nc, QUOTA_REMOVE, {"name": "alice"})
        assert removed == {"policy": "alice", "recorded": True}
        missing = await request(nc, QUOTA_REMOVE, {"name": "alice"})
        assert missing["error"]["code"] == "not-found"
        bad = await request(nc, QUOTA_SET, {"name": "not a token", "max_cpu": 1})
        assert bad["error"]["code"] == "invalid-request"
        negative = await request(nc, QUOTA_SET, {"name": "bob", "max_cpu": -1})
        assert negative["error"]["code"] == "invalid-request"
        assert "max_cpu" in negative["error"]["message"]
        records = await store.read_subject(f"{subjects.EVENTS}.resource-policy.alice")
        assert [r.headers[TYPE_HEADER] for r in records] == [
            "ResourcePolicySet",
            "ResourcePolicySet",
            "ResourcePolicyRemoved",
        ]
        assert m.fleet.resource_policies["alice"].removed
    async with manager(nc) as again_m:  # a restart folds the same policies
        assert again_m.fleet.resource_policies["alice"].removed
        await asyncio.sleep(0)
