"""Sessions driven from create to RUNNING and back, with in-process dummy agents."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.kernels import Kernels
from agent.server import AgentServer
from domain import rpc, subjects
from domain.status import Kernel
from domain.subjects import SESSION_CREATE, SESSION_DESTROY, SESSION_GET
from eventstore.store import EventStore
from services.manager.agent_rpc import AgentRpc, AgentUnreachable
from services.manager.main import Manager
from tests.manager.harness import (
    MB,
    SETTLED,
    agents,
    create,
    create_payload,
    get,
    manager,
    request,
    until,
)
from transport.client import Client


def statuses(history: list[Any]) -> list[str]:
    return [c.status.value for c in history]


async def _runs_after_going_back(
    nc: Client, m: Manager, agent: AgentServer, within: float
) -> Kernel:
    """Remove base:1 from ``agent`` outside Hoist, create a session there: its kernel is sent
    back from its create, pulls, and runs."""
    assert await agent.runtime.remove_image("base:1")
    created = await create(nc, max_wait=within)
    assert created["status"] == "RUNNING", created
    [kernel] = m.fleet.sessions[created["session_id"]].kernels.values()
    assert statuses(kernel.status_history) == [
        "PENDING", "SCHEDULED", "PREPARED", "CREATING",
        "PREPARING", "PULLING", "PREPARED", "CREATING", "RUNNING",
    ]  # fmt: skip
    return kernel


async def test_a_session_whose_image_is_present_runs(nc: Client, store: EventStore) -> None:
    async with agents(nc, store, ["a1"]) as running, manager(nc) as m:
        created = await create(nc, max_wait=5)
        assert created["status"] == "RUNNING", created
        [kernel] = created["kernels"]
        assert kernel["agent_id"] == "a1" and kernel["container_id"]
        assert kernel["status_info"] == "running"
        assert {k.kernel_id for k in running["a1"].runtime.kernels.values()} == {
            kernel["kernel_id"]
        }
        session = m.fleet.sessions[created["session_id"]]
        # Every change has its status_info; the log showed the image on a1 (it registered
        # with it), so no check-and-pull was asked and nothing pulled.
        history = session.kernels[kernel["kernel_id"]].status_history
        assert statuses(history) == ["PENDING", "SCHEDULED", "PREPARED", "CREATING", "RUNNING"]
        assert history[2].status_info == "image-present: a1 holds it, by the event log"
        assert all(c.status_info for c in history)
        assert running["a1"].image_gc.leases == {}  # what a check-and-pull leaves
        assert running["a1"].runtime.pull_attempts == {}


async def test_an_image_gone_from_its_agent_is_pulled_again_and_the_kernel_runs(
    nc: Client, store: EventStore
) -> None:
    """The log shows the image on a1, but it was removed there outside Hoist (no
    ImageRemoved): the create finds it missing, the kernel goes back to PREPARING, its image
    is pulled, and it runs."""
    async with agents(nc, store, ["a1"]) as running, manager(nc) as m:
        kernel = await _runs_after_going_back(nc, m, running["a1"], within=5)
        missing = kernel.status_history[4].status_info
        assert missing == (
            "image-missing: a1 had no docker.io/library/base:1 at the create; checking"
            " again, pulling it if need be"
        )
        assert running["a1"].runtime.pull_attempts == {"base:1": 1}
        agent_log = [r.headers["Hoist-Event"] for r in await store.read_subject(
            "hoist.events.agent.a1")]  # fmt: skip
        assert agent_log[-3:] == ["ImageRemoved", "ImagePullStarted", "ImagePulled"], agent_log
        # The pull put it back in the log: the next session on a1 asks nothing.
        second = await create(nc, max_wait=5)
        [k2] = m.fleet.sessions[second["session_id"]].kernels.values()
        assert statuses(k2.status_history)[2:] == ["PREPARED", "CREATING", "RUNNING"]


async def test_a_kernel_sent_back_for_its_image_runs_beside_its_running_sibling(
    nc: Client, store: EventStore
) -> None:
    """Two kernels placed where the log shows the image; a2 lost it outside Hoist: k1 runs,
    k2 goes back for its image (pulled slowly, so k1 is seen running meanwhile) and then runs
    too, without k1 being touched."""
    async with (
        agents(nc, store, ["a1", "a2"], bandwidth_bps=100 * MB, default_size=40 * MB) as running,
        manager(nc) as m,
    ):
        assert await running["a2"].runtime.remove_image("base:1")
        created = await create(nc, cluster_size=2, cluster_mode="multi-node", max_wait=0)
        sid = created["session_id"]
        await until(
            nc,
            sid,
            lambda s: sorted(k["status"] for k in s["kernels"]) == ["PULLING", "RUNNING"],
            5,
            "one running, one pulling",
        )
        done = await until(nc, sid, within=10)
        assert done["status"] == "RUNNING", done
        by_agent = {k.agent_id: k for k in m.fleet.sessions[sid].kernels.values()}
        assert statuses(by_agent["a1"].status_history)[2:] == ["PREPARED", "CREATING", "RUNNING"]
        assert statuses(by_agent["a2"].status_history)[2:] == [
            "PREPARED", "CREATING", "PREPARING", "PULLING", "PREPARED", "CREATING", "RUNNING"
        ]  # fmt: skip
        assert running["a2"].runtime.pull_attempts == {"base:1": 1}
        assert len(running["a1"].runtime.kernels) == len(running["a2"].runtime.kernels) == 1


async def test_a_session_destroyed_while_its_create_runs_leaves_room_for_the_next(
    nc: Client, store: EventStore
) -> None:
    """A's create takes 0.5 s on a1 (2 cpu); A is destroyed meanwhile, so its room is free in
    the log while the agent still creates it.  B, placed there, waits on the agent for the
    work in flight (A's create, then the destroy the manager sends after it), and runs."""
    async with agents(nc, store, ["a1"], cpu=2, create_delay_s=0.5) as running, manager(nc):
        big = {"cpu": 2, "mem": 256 * MB}
        first = await create(nc, resources=big, max_wait=0)
        await until(nc, first["session_id"], lambda s: s["status"] == "CREATING", 2, "creating")
        gone = await request(nc, SESSION_DESTROY, {"session_id": first["session_id"]})
        assert gone["status"] == "CANCELLED", gone
        second = await create(nc, resources=big, max_wait=5)
        assert second["status"] == "RUNNING", second
        assert [k.session_id for k in running["a1"].runtime.kernels.values()] == [
            second["session_id"]
        ]


async def test_an_agent_records_an_image_gone_only_when_it_is(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"]) as running:
        a1 = running["a1"]

        async def agent_log() -> list[Any]:
            return await store.read_subject("hoist.events.agent.a1")

        before = len(await agent_log())
        await a1.kernels.record_missing("base:1")  # the engine holds it (a pull brought it back)
        assert len(await agent_log()) == before
        assert await a1.runtime.remove_image("base:1")
        await a1.kernels.record_missing("base:1")
        [*_, removed] = await agent_log()
        assert removed.headers["Hoist-Event"] == "ImageRemoved"
        assert a1.facts.aggregate is not None and "base:1" not in a1.facts.aggregate.images


async def test_an_engine_error_while_recording_an_image_gone_is_only_logged(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Best effort: the create's reply stays image-missing (the kernel goes back for its
    image) even when the engine cannot say whether it holds the image."""
    async with agents(nc, store, ["a1"]) as running:
        a1 = running["a1"]

        async def broken(image: str) -> None:
            raise RuntimeError("engine unreachable")

        monkeypatch.setattr(a1.runtime, "has_image", broken)
        before = await store.read_subject("hoist.events.agent.a1")
        await a1.kernels.record_missing("base:1")
        assert await store.read_subject("hoist.events.agent.a1") == before
        assert "could not record base:1 gone" in caplog.text


async def test_a_create_asked_again_does_not_wait_for_a_siblings_pull(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k1's first create gets no answer while k2 goes back for its image and pulls it (2 s):
    k1's create is asked again at once (retry 0.2 s), not after k2's pull."""
    real_call = AgentRpc.call
    unanswered: list[str] = []

    async def call(self: AgentRpc, agent_id: str, verb: str, request: object, **kw: Any) -> Any:
        if agent_id == "a1" and verb == rpc.CREATE_KERNEL and not unanswered:
            unanswered.append(agent_id)
            raise AgentUnreachable("agent a1 create-kernel: TimeoutError")
        return await real_call(self, agent_id, verb, request, **kw)

    monkeypatch.setattr(AgentRpc, "call", call)
    async with (
        agents(nc, store, ["a1", "a2"], bandwidth_bps=20 * MB, default_size=40 * MB) as running,
        manager(nc),
    ):
        assert await running["a2"].runtime.remove_image("base:1")
        created = await create(nc, cluster_size=2, cluster_mode="multi-node", max_wait=0)
        by_agent = await until(
            nc,
            created["session_id"],
            lambda s: sorted(k["status"] for k in s["kernels"]) == ["PULLING", "RUNNING"],
            1.5,
            "k1 running while k2 pulls",
        )
        assert {k["agent_id"]: k["status"] for k in by_agent["kernels"]} == {
            "a1": "RUNNING", "a2": "PULLING"
        }  # fmt: skip
        assert unanswered == ["a1"]
        done = await until(nc, created["session_id"], within=10)
        assert done["status"] == "RUNNING", done


async def test_a_kernel_sent_back_waits_for_its_pull_though_the_view_shows_the_image(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's ImageRemoved did not make it (or is not folded yet): the view still shows
    the image on a1 while the kernel waits for its pull.  Neither the reactor nor the
    check-pulling-kernels loop (every 0.2 s here, over a 0.8 s pull) takes the stale image for
    the pulled one: the kernel goes back once, and runs once its pull is seen finished."""

    async def lost(self: Kernels, image: str) -> None:
        return None

    monkeypatch.setattr(Kernels, "record_missing", lost)
    async with (
        agents(nc, store, ["a1"], bandwidth_bps=50 * MB, default_size=40 * MB) as running,
        manager(nc) as m,
    ):
        await _runs_after_going_back(nc, m, running["a1"], within=10)
        assert running["a1"].runtime.pull_attempts == {"base:1": 1}


async def test_an_image_to_pull_goes_pulling_then_running_for_both_kernels(
    nc: Client, store: EventStore
) -> None:
    # 40 MB at 100 MB/s: the pull is long enough to be seen.
    async with (
        agents(nc, store, ["a1", "a2"], bandwidth_bps=100 * MB, default_size=40 * MB) as running,
        manager(nc) as m,
    ):
        created = await create(nc, image="py:3", cluster_size=2, max_wait=0)
        assert created["status"] == "PENDING" and created["status_info"] == "enqueued"
        sid = created["session_id"]
        pulling = await until(
            nc, sid, lambda s: all(k["status"] == "PULLING" for k in s["kernels"]), 5, "pulling"
        )
        assert all(k["pull_task_id"] and k["agent_id"] for k in pulling["kernels"])
        done = await until(nc, sid, within=10)
        assert done["status"] == "RUNNING", done
        # Dispersed by default: one kernel on each agent, each agent pulled once.
        assert {k["agent_id"] for k in done["kernels"]} == {"a1", "a2"}
        assert all(a.runtime.pull_attempts == {"py:3": 1} for a in running.values())
        for k in m.fleet.sessions[sid].kernels.values():
            assert statuses(k.status_history) == [
                "PENDING", "SCHEDULED", "PREPARING", "PULLING", "PREPARED", "CREATING", "RUNNING"
            ]  # fmt: skip


async def test_destroy_removes_the_containers(nc: Client, store: EventStore) -> None:
    async with agents(nc, store, ["a1", "a2"]) as running, manager(nc) as m:
        created = await create(nc, cluster_size=2, max_wait=5)
        assert created["status"] == "RUNNING"
        reply = await request(nc, SESSION_DESTROY, {"session_id": created["session_id"]})
        assert {k["status"] for k in reply["kernels"]} == {"TERMINATING"}
        done = await until(nc, created["session_id"])
        assert done["status"] == "TERMINATED"
        assert {k["status_info"] for k in done["kernels"]} == {"user-requested"}
        assert all(not a.runtime.kernels for a in running.values())
        assert all(s.reserved_cpu == 0 for s in m.fleet.agents.values())


async def test_destroying_a_pending_session_cancels_it(nc: Client, store: EventStore) -> None:
    async with manager(nc):  # no agents: it stays PENDING
        created = await create(nc)
        pending = await until(
            nc, created["session_id"], lambda s: "no-available" in s["status_info"]
        )
        assert pending["status"] == "PENDING"
        reply = await request(nc, SESSION_DESTROY, {"session_id": created["session_id"]})
        assert reply["status"] == "CANCELLED" and reply["status_info"] == "user-requested"


async def test_the_same_request_id_creates_one_session(nc: Client, store: EventStore) -> None:
    async with agents(nc, store, ["a1"]), manager(nc) as m:
        payload = create_payload(request_id="req-1")
        replies = await asyncio.gather(*(request(nc, SESSION_CREATE, payload) for _ in range(5)))
        assert len({r["session_id"] for r in replies}) == 1, replies
        assert len(m.fleet.sessions) == 1
        # One of them created it; the others found it (retries of the same request).
        assert sorted(r["created"] for r in replies) == [False] * 4 + [True], replies
        again = await request(nc, SESSION_CREATE, payload)
        assert again["created"] is False and again["session_id"] == replies[0]["session_id"]
        assert "created" not in await get(nc, again["session_id"])  # a create's reply only
        # Same request id, other parameters: refused, naming what differs.
        other = await request(nc, SESSION_CREATE, create_payload(request_id="req-1", image="x:1"))
        assert other["error"]["code"] == "conflict" and "image" in other["error"]["message"]
        # Another owner may use the same request id for their own session.
        theirs = await request(nc, SESSION_CREATE, create_payload(request_id="req-1", owner="bob"))
        assert theirs["session_id"] != replies[0]["session_id"] and theirs["created"] is True
        events = [r async for r in store.replay()]
        enqueued = [r for r in events if r.headers.get("Hoist-Event") == "SessionEnqueued"]
        assert len(enqueued) == 2


async def test_bad_requests_name_the_field_and_append_nothing(
    nc: Client, store: EventStore
) -> None:
    async with manager(nc):
        before = await store.last_seq(f"{subjects.EVENTS}.>")
        cases = {
            "owner": create_payload(owner=""),
            "resources": create_payload(resources={"cpu": 0, "mem": 1}),
            "cluster_size": create_payload(cluster_size=0),
            "max_wait": create_payload(max_wait=-1),
            "colour": create_payload(colour="red"),
            "resource_group": create_payload(resource_group="has space"),
        }
        for field, payload in cases.items():
            reply = await request(nc, SESSION_CREATE, payload)
            assert reply["error"]["code"] == "invalid-request", (field, reply)
            assert field in reply["error"]["message"], (field, reply)
        reply = await request(nc, SESSION_CREATE, b"not json")
        assert reply["error"]["code"] == "invalid-request"
        reply = await request(nc, SESSION_GET, {"session_id": "nope"})
        assert reply["error"]["code"] == "not-found" and "session_id" in reply["error"]["message"]
        assert await store.last_seq(f"{subjects.EVENTS}.>") == before


async def test_a_kernel_that_fails_to_start_errors_and_its_sibling_is_destroyed(
    nc: Client, store: EventStore
) -> None:
    async with (
        agents(nc, store, ["a1"], create_failures={"base:1"}),
        agents(nc, store, ["a2"]) as healthy,
        manager(nc),
    ):
        created = await create(nc, cluster_size=2, max_wait=5)
        assert created["status"] == "ERROR", created
        by_agent = {k["agent_id"]: k for k in created["kernels"]}
        assert by_agent["a1"]["status_info"] == (
            "failed-to-start: create-failed: injected create failure"
        )
        done = await until(
            nc, created["session_id"], lambda s: all(k["status"] in SETTLED for k in s["kernels"])
        )
        sibling = next(k for k in done["kernels"] if k["agent_id"] == "a2")
        assert sibling["status"] in ("TERMINATED", "CANCELLED"), sibling
        assert sibling["status_info"].startswith("sibling-failed: kernel ")
        assert not healthy["a2"].runtime.kernels  # its container was removed
