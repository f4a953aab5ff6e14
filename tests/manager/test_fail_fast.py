"""Fail fast at create (issue 15): a session no live agent of its group could ever hold, or one
asking for less than a runtime enforces, is refused before anything is appended; a group with
no live agent yet (a stack starting) is waited for, as before."""

from __future__ import annotations

from domain import subjects
from domain.subjects import SESSION_CREATE
from eventstore.store import EventStore
from tests.agent.agent_harness import wait_for
from tests.manager.harness import GB, MB, agents, create, create_payload, manager, request
from transport.client import Client

SESSIONS = f"{subjects.EVENTS}.session.>"


async def test_a_session_no_live_agent_could_hold_is_refused_naming_the_largest(
    nc: Client, store: EventStore
) -> None:
    async with (
        agents(nc, store, ["a1"], cpu=4, mem=8 * GB) as small,
        agents(nc, store, ["a2"], cpu=8, mem=4 * GB),
        manager(nc) as m,
    ):
        await wait_for(lambda: len([a for a in m.fleet.agents.values() if a.live]) == 2, 5)
        before = await store.last_seq(SESSIONS)
        too_big = create_payload(resources={"cpu": 1000, "mem": 256 * MB})
        reply = await request(nc, SESSION_CREATE, too_big)
        assert reply["error"]["code"] == "invalid-request", reply
        assert reply["error"]["message"].startswith(
            "resources.cpu: asks 1000 cpu but the largest live agent of resource group"
            " 'default', a2, has 8 cpu: this session could never start"
        ), reply
        # Multi-kernel: each kernel fits, three of them on one agent (single-node) do not.
        single = create_payload(
            resources={"cpu": 3, "mem": 256 * MB}, cluster_size=3, cluster_mode="single-node"
        )
        reply = await request(nc, SESSION_CREATE, single)
        assert "ask 9 cpu on one agent but the largest" in reply["error"]["message"], reply
        # A slot no agent offers: leave it out (not "ask for less").
        unknown = create_payload(resources={"cpu": 1, "mem": 256 * MB, "foo": 1})
        reply = await request(nc, SESSION_CREATE, unknown)
        assert reply["error"]["message"] == (
            "resources.foo: asks 1 foo but no live agent of resource group 'default' offers"
            " foo: this session could never start; leave resources.foo out, or use a resource"
            " group whose agents offer it (hoist agents lists them)"
        ), reply
        assert await store.last_seq(SESSIONS) == before  # nothing appended
        assert small["a1"].runtime.pull_attempts == {}
        # What fits when the agents are idle is taken (and waits for room if need be).
        fits = await create(nc, resources={"cpu": 3, "mem": 256 * MB}, cluster_size=3)
        assert fits["status"] not in ("ERROR", "CANCELLED"), fits


async def test_with_no_live_agent_yet_a_big_session_waits(nc: Client, store: EventStore) -> None:
    """A stack just started: its agents are not registered yet, so nothing is known to be too
    small, and the session waits PENDING for them (max_wait applies)."""
    async with manager(nc):
        waiting = await create(nc, resources={"cpu": 1000, "mem": 256 * MB}, max_wait=0.3)
        assert waiting["status"] == "PENDING", waiting
        assert "has no live agents" in waiting["status_info"], waiting


async def test_less_memory_than_a_runtime_enforces_is_refused_before_any_pull(
    nc: Client, store: EventStore
) -> None:
    async with agents(nc, store, ["a1"]) as running, manager(nc):
        before = await store.last_seq(SESSIONS)
        payload = create_payload(image="py:3", resources={"cpu": 1, "mem": 3 * MB})
        reply = await request(nc, SESSION_CREATE, payload)
        assert reply["error"]["code"] == "invalid-request", reply
        assert reply["error"]["message"].startswith(
            "$.resources.mem: must be at least 6 MiB (6291456 bytes), got 3145728"
        ), reply
        assert await store.last_seq(SESSIONS) == before
        assert running["a1"].runtime.pull_attempts == {}  # the image was never pulled
