"""PULLING kernels: pull failure, superadmin force-cancel (and its refusal for a client), the
check-pulling-kernels loop recovering a lost ImagePulled and a restarted agent, stall, timeout."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nats
import pytest

from agent.pulls import PullPolicy
from agent.runtime.dummy import DummyHost, PullFailure
from domain import events as ev
from domain import subjects
from domain.codec import ACTOR_HEADER, TYPE_HEADER
from domain.scheduling import Limits
from domain.subjects import KERNEL_CANCEL, SESSION_DESTROY
from eventstore.store import EventStore, event_store
from services.stack import natsauth
from services.stack.natsserver import NatsServer
from tests.agent.agent_harness import config, event_of, running, wait_for
from tests.manager.harness import (
    GB,
    MB,
    agents,
    create,
    dummy,
    internal_names,
    manager,
    request,
    until,
)
from transport import credentials
from transport.client import Client, connect

SLOW = {"bandwidth_bps": 1 * MB, "default_size": 40 * MB, "tick_s": 0.05}  # 40 s pulls


def all_pulling(s: dict[str, Any]) -> bool:
    return all(k["status"] == "PULLING" for k in s["kernels"])


async def test_a_failed_pull_cancels_every_kernel_waiting_for_it(
    nc: Client, store: EventStore
) -> None:
    failure = PullFailure("not-found", "manifest unknown", stall_at=0.5)
    async with (
        agents(
            nc, store, ["a1"], bandwidth_bps=50 * MB, default_size=20 * MB,
            pull_failures={"bad:1": failure},
        ) as running_agents,
        manager(nc) as m,
    ):  # fmt: skip
        first, second = await asyncio.gather(
            create(nc, image="bad:1"), create(nc, image="bad:1", owner="bob")
        )
        for s in (first, second):
            done = await until(nc, s["session_id"])
            assert done["status"] == "CANCELLED", done
            assert done["status_info"] == "image-pull-failed: manifest unknown"
        assert running_agents["a1"].runtime.pull_attempts == {"bad:1": 1}  # one pull for both
        assert m.fleet.agents["a1"].reserved_cpu == 0 and m.fleet.agents["a1"].reserved_mem == 0


async def test_the_loop_promotes_a_kernel_whose_image_pulled_event_was_lost(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        agents(nc, store, ["a1"], bandwidth_bps=50 * MB, default_size=10 * MB) as running_agents,
        manager(nc) as m,
    ):
        facts = running_agents["a1"].facts

        async def lost(*args: object) -> None:  # the agent's ImagePulled never reaches the log
            return None

        monkeypatch.setattr(facts, "pulled", lost)
        created = await create(nc, image="py:3")
        done = await until(nc, created["session_id"])
        assert done["status"] == "RUNNING", done
        kernel = next(iter(m.fleet.sessions[created["session_id"]].kernels.values()))
        prepared = [c for c in kernel.status_history if c.status.value == "PREPARED"]
        assert [c.status_info for c in prepared] == ["image-pulled: the pull finished on a1"]
        assert internal_names(m) == []  # user-facing words only, from enqueue to RUNNING


async def test_the_loop_asks_a_restarted_agent_to_pull_again(nc: Client, store: EventStore) -> None:
    host = DummyHost()  # the same host across the agent's restart
    cfg = config(
        "a1", cpu=4, mem=8 * GB, resource_group="default",
        pulls=PullPolicy(stall_timeout_s=60),
    )  # fmt: skip
    stalls = {"py:3": PullFailure("stall", stall_at=0.3)}
    async with manager(nc, stall_timeout_s=60) as m:
        async with running(nc, store, dummy("a1", host, pull_failures=stalls), cfg):
            created = await create(nc, image="py:3")
            sid = created["session_id"]
            await until(nc, sid, all_pulling, 5, "pulling")
        # The agent restarts: its pull is gone with it, and the new process pulls fine.
        async with running(nc, store, dummy("a1", host), cfg) as again:
            done = await until(nc, sid, within=10)
            assert done["status"] == "RUNNING", done
            assert again.runtime.pull_attempts == {"py:3": 1}
        kernel = next(iter(m.fleet.sessions[sid].kernels.values()))
        assert [c.status.value for c in kernel.status_history][-4:] == [
            "PULLING", "PREPARED", "CREATING", "RUNNING"
        ]  # fmt: skip
        assert internal_names(m) == []


async def test_a_stalled_pull_is_cancelled_by_the_loop(nc: Client, store: EventStore) -> None:
    stalls = {"py:3": PullFailure("stall", stall_at=0.3)}
    async with (
        agents(
            nc, store, ["a1"], bandwidth_bps=50 * MB, default_size=10 * MB, pull_failures=stalls,
        ),
        manager(nc, stall_timeout_s=0.6) as m,
    ):  # fmt: skip
        created = await create(nc, image="py:3")
        done = await until(nc, created["session_id"])
        assert done["status"] == "CANCELLED"
        assert done["status_info"] == "pull-stalled: no progress for 0.6s"
        assert m.fleet.agents["a1"].reserved_cpu == 0


async def test_a_pull_past_the_pull_timeout_is_cancelled(nc: Client, store: EventStore) -> None:
    async with agents(nc, store, ["a1"], **SLOW), manager(nc, pull_timeout_s=0.5):
        created = await create(nc, image="py:3")
        done = await until(nc, created["session_id"])
        assert done["status"] == "CANCELLED"
        assert done["status_info"] == "pull-timeout: not pulled after 0.5s"


async def test_only_a_superadmin_force_cancels_a_pulling_kernel(tmp_path: Path) -> None:
    creds = natsauth.generate_credentials(tmp_path, ["a1"])
    conf = natsauth.write_server_config(tmp_path, creds, tmp_path / "js")
    with NatsServer(tmp_path / "js", config=conf) as server:
        conns = {}
        for role in ("manager", "client", "admin"):
            conns[role] = await connect(credentials.role_url(server.url, role, creds))
        conns["a1"] = await connect(credentials.role_url(server.url, "agent", creds, "a1"))
        try:
            await _force_cancel(conns, creds)
        finally:
            for c in conns.values():
                await c.close()


async def _force_cancel(conns: dict[str, Client], creds: credentials.Credentials) -> None:
    agent_nc = conns["a1"]
    cfg = config("a1", cpu=4, mem=8 * GB, resource_group="default")
    async with manager(conns["manager"]) as m:
        async with running(agent_nc, event_store(agent_nc), dummy("a1", **SLOW), cfg):
            created = await create(conns["client"], image="py:3")
            sid = created["session_id"]
            pulling = await until(conns["client"], sid, all_pulling, 5, "pulling")
            kernel_id = pulling["kernels"][0]["kernel_id"]
            assert m.fleet.agents["a1"].reserved_cpu == 1
            payload = {"kernel_id": kernel_id, "reason": "stuck registry"}
            # A client may not even send it: the server refuses the publish.
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await request(conns["client"], KERNEL_CANCEL, payload, within=1)
            assert all_pulling(await until(conns["client"], sid, all_pulling))
            reply = await request(conns["admin"], KERNEL_CANCEL, payload)
            assert reply["status"] == "CANCELLED", reply
            assert reply["kernels"][0]["status_info"] == "force-cancelled: stuck registry"
            await wait_for(lambda: m.fleet.agents["a1"].reserved_cpu == 0, 5, "room freed")
            # Running or final kernels are refused, naming the field.
            again = await request(conns["admin"], KERNEL_CANCEL, payload)
            assert again["error"]["code"] == "illegal-transition"
            assert "kernel_id" in again["error"]["message"]
            unknown = await request(conns["admin"], KERNEL_CANCEL, {"kernel_id": "nope"})
            assert unknown["error"]["code"] == "not-found"
            # The audit trail says who caused each event.
            store = event_store(conns["manager"])
            by = {
                r.headers[TYPE_HEADER]: r.headers.get(ACTOR_HEADER)
                for r in await store.read_subject(subjects.session_events(sid))
            }
            assert by["SessionEnqueued"] == "client" and by["SessionScheduled"] == "manager"
            assert by["KernelCancelled"] == "admin"
            agent_records = await store.read_subject(subjects.agent_events("a1"))
            assert {r.headers.get(ACTOR_HEADER) for r in agent_records} == {"agent:a1"}


async def test_a_pulling_session_holds_no_user_resources_but_is_a_session(
    nc: Client, store: EventStore
) -> None:
    limits = Limits(max_sessions_per_owner=2)
    async with agents(nc, store, ["a1"], **SLOW), manager(nc, limits=limits) as m:
        pulling = await create(nc, image="py:3")
        await until(nc, pulling["session_id"], all_pulling, 5, "pulling")
        assert "alice" not in m.fleet.owner_usage or m.fleet.owner_usage["alice"].cpu == 0
        assert m.fleet.agents["a1"].reserved_cpu == 1  # seed 000: it holds its agent slot only
        # ... but it is a session: per-owner session limits count it, so any number of pulls
        # ending cannot start sessions past them
        assert m.fleet.owner_sessions["alice"] == 1
        second = await create(nc, image="base:1", max_wait=5)
        assert second["status"] == "RUNNING", second
        assert m.fleet.owner_usage["alice"].cpu == 1  # the running one only
        third = await create(nc, image="base:1", max_wait=0.3)
        assert third["status_info"].startswith("predicate-checks-failed: max_sessions_per_owner")


async def test_a_destroyed_pulling_kernels_pull_is_cancelled_unless_another_waits(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"], **SLOW) as running_agents, manager(nc):
        pulls = running_agents["a1"].pulls
        first = await create(nc, image="py:3")
        second = await create(nc, image="py:3", owner="bob")  # waits for the same pull
        for s in (first, second):
            await until(nc, s["session_id"], all_pulling, 5, "pulling")
        task = pulls.active["docker.io/library/py:3"]
        assert len(task.kernels) == 2
        destroyed = await request(nc, SESSION_DESTROY, {"session_id": first["session_id"]})
        assert destroyed["status"] == "CANCELLED", destroyed
        await wait_for(lambda: len(task.kernels) == 1, 5, "first kernel released")
        await asyncio.sleep(0.3)
        assert task.state == "pulling"  # bob's kernel still waits for it
        destroyed = await request(nc, SESSION_DESTROY, {"session_id": second["session_id"]})
        assert destroyed["status"] == "CANCELLED", destroyed
        await asyncio.wait_for(task.ended.wait(), 5)  # a 40 s pull, stopped early
        assert task.state == "cancelled" and task.current < task.total
        failed = await event_of(store, "a1", ev.ImagePullFailed, task_id=task.task_id)
        assert failed.cancelled and failed.reason.startswith("no kernel waits for it")
        assert await running_agents["a1"].runtime.has_image("py:3") is None
