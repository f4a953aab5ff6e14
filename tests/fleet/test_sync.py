"""Agent resource sync on dummy agents: the triggers (a multi-agent creation failure), the admin
command, and drift repaired from heartbeats alone."""

from __future__ import annotations

import asyncio
import time

import pytest

from domain import rpc
from domain.subjects import AGENT_SYNC
from eventstore.repository import loaded_seq
from eventstore.store import EventStore
from services.manager import agent_sync
from tests.agent.agent_harness import call, wait_for
from tests.fleet.fleet_harness import admin, fleet
from tests.manager.harness import GB, MB, create, manager, request, until
from transport.client import Client

NO_RECONCILE = {"reconcile_interval_s": 3600.0}


async def _strays(nc: Client, agent_ids: list[str]) -> None:
    """Fill each agent with a container the manager never heard of (cpu 2 of its 2)."""
    for agent_id in agent_ids:
        reply = await call(
            nc,
            agent_id,
            rpc.CREATE_KERNEL,
            {
                "kernel_id": f"stray-{agent_id}",
                "session_id": "elsewhere",
                "image": "base:1",
                "resources": {"cpu": 2, "mem": 64 * MB},
            },
        )
        assert "container_id" in reply, reply


@pytest.mark.parametrize(
    "triggers",
    [
        frozenset({"on-creation-failure"}),
        frozenset({"before-kernel-creation"}),
        frozenset({"after-scheduling", "on-creation-failure"}),
    ],
)
async def test_a_creation_failure_on_several_agents_is_repaired_by_one_sync_each(
    nc: Client, store: EventStore, triggers: frozenset[str]
) -> None:
    disks = {"a1": 10 * GB, "a2": 10 * GB}
    async with fleet(nc, store, disks, cpu=2) as agents:
        await _strays(nc, ["a1", "a2"])
        async with manager(nc, sync_triggers=triggers, **NO_RECONCILE) as m:
            created = await create(nc, cluster_size=2, resources={"cpu": 2, "mem": 256 * MB})
            done = await until(nc, created["session_id"])
            assert done["status"] == "RUNNING", done
            assert {k["agent_id"] for k in done["kernels"]} == {"a1", "a2"}
            for agent in agents.values():  # the strays went, the kernels came
                assert {k.kernel_id for k in await agent.runtime.list_kernels()} == {
                    k["kernel_id"] for k in done["kernels"] if k["agent_id"] == agent.id
                }
            # One sync per agent for the whole session (both refusals handled at once).
            assert m.sync.syncs == 2


async def test_without_a_sync_trigger_the_same_session_fails_to_start(
    nc: Client, store: EventStore
) -> None:
    async with fleet(nc, store, {"a1": 10 * GB, "a2": 10 * GB}, cpu=2):
        await _strays(nc, ["a1", "a2"])
        async with manager(nc, sync_triggers=frozenset(), **NO_RECONCILE) as m:
            created = await create(nc, cluster_size=2, resources={"cpu": 2, "mem": 256 * MB})
            done = await until(nc, created["session_id"])
            assert done["status"] == "ERROR"
            assert "insufficient-resources" in done["status_info"], done
            assert m.sync.syncs == 0


async def test_the_admin_sync_command_reports_and_repairs(nc: Client, store: EventStore) -> None:
    async with fleet(nc, store, {"a1": 10 * GB}) as agents, manager(nc, **NO_RECONCILE):
        created = await create(nc, max_wait=5)
        [kernel] = created["kernels"]
        runtime = agents["a1"].runtime
        await runtime.destroy(kernel["kernel_id"])  # killed outside Hoist
        await runtime.create("intruder", "s0", "base:1", 1, 64 * MB)
        reply = await admin(nc, AGENT_SYNC, {"agent_ids": ["a1"]})
        assert reply == {
            "agents": {
                "a1": {
                    "running": [],
                    "terminated": [kernel["kernel_id"]],
                    "destroyed": ["intruder"],
                    "spared": [],
                    "repaired": [kernel["kernel_id"]],
                }
            }
        }
        done = await until(nc, created["session_id"], lambda s: s["status"] != "RUNNING")
        assert done["status"] == "TERMINATED"
        assert done["kernels"][0]["status_info"] == "container-gone: not found on agent a1"
        bad = await request(nc, AGENT_SYNC, {"agent_ids": ["nope"]})
        assert bad["error"]["code"] == "not-found" and "agent_ids" in bad["error"]["message"]
        bad = await request(nc, AGENT_SYNC, {"agents": ["a1"]})
        assert bad["error"]["code"] == "invalid-request" and "agents" in bad["error"]["message"]


async def test_a_view_behind_a_create_does_not_destroy_its_container(
    nc: Client, store: EventStore
) -> None:
    """create-kernel carries the session's stream sequence and sync-kernels the view's: a view
    that has not folded the create yet (a second manager, a paused leader) spares the
    container (a flake once had two managers' syncs destroy each other's kernels)."""
    async with fleet(nc, store, {"a1": 10 * GB}) as agents, manager(nc, **NO_RECONCILE) as m:
        created = await create(nc, max_wait=5)
        [kernel] = created["kernels"]
        asked_at, _ = agents["a1"].spares.asked_at[kernel["kernel_id"]]
        session = m.fleet.sessions[created["session_id"]]
        assert 0 < asked_at < loaded_seq(session)  # the CREATING record, before RUNNING's
        await wait_for(lambda: m.fleet.last_seq >= asked_at, 5, "the view past the create")
        assert m.sync.truth("a1").view_seq == m.fleet.last_seq
        lagging = await call(nc, "a1", rpc.SYNC_KERNELS, {"view_seq": asked_at - 1})
        assert lagging["spared"] == [kernel["kernel_id"]] and "destroyed" not in lagging
        reply = await admin(nc, AGENT_SYNC, {"agent_ids": ["a1"]})
        assert reply["agents"]["a1"]["running"] == [kernel["kernel_id"]]
        assert (await until(nc, created["session_id"]))["status"] == "RUNNING"


async def test_heartbeats_repair_drift_without_any_trigger(nc: Client, store: EventStore) -> None:
    quick = {"reconcile_interval_s": 0.2, "reconcile_grace_s": 0.3, "sync_triggers": frozenset()}
    async with (
        fleet(nc, store, {"a1": 10 * GB, "a2": 10 * GB}) as agents,
        manager(nc, **quick) as m,
    ):
        first = await create(nc, max_wait=5)
        second = await create(nc, max_wait=5)
        assert first["status"] == second["status"] == "RUNNING"
        # Agents that agree with their beats are not visited again until something changes,
        # and once the manager acknowledged a full beat, beats carry the changes only.
        await wait_for(lambda: m.sync.visited == 0, 10, "a round that visits no agent")
        await wait_for(
            lambda: all(a.heartbeats.beats.base is not None for a in agents.values()),
            10,
            "beats acked",
        )
        victim = first["kernels"][0]
        host = agents[victim["agent_id"]].runtime
        await host.destroy(victim["kernel_id"])  # a container killed outside Hoist
        other = agents["a2" if victim["agent_id"] == "a1" else "a1"].runtime
        await other.create("stowaway", "s0", "base:1", 1, 64 * MB)  # one Hoist never made
        done = await until(nc, first["session_id"], lambda s: s["status"] != "RUNNING", 10)
        assert done["status"] == "TERMINATED"
        assert done["kernels"][0]["status_info"] == (
            f"container-gone: not found on agent {victim['agent_id']}"
        )
        await wait_for(
            lambda: "stowaway" not in other.kernels, 10, "the unknown container destroyed"
        )
        # The healthy session was left alone.
        assert (await until(nc, second["session_id"]))["status"] == "RUNNING"


async def test_running_kernels_of_a_lost_agent_end_agent_lost(
    nc: Client, store: EventStore
) -> None:
    settings = {
        "liveness_deadline_s": 0.6,
        "lost_grace_s": 0.4,
        "reconcile_interval_s": 0.2,
    }
    async with fleet(nc, store, {"a1": 10 * GB}) as agents, manager(nc, **settings) as m:
        created = await create(nc, max_wait=5)
        assert created["status"] == "RUNNING"
        await agents["a1"].stop()  # the host goes dark
        done = await until(nc, created["session_id"], lambda s: s["status"] != "RUNNING", 10)
        assert done["status"] == "TERMINATED"
        assert done["kernels"][0]["status_info"] == (
            "agent-lost: a1 (heartbeat-timeout: no heartbeat for 0.6s)"
        )
        assert m.fleet.agents["a1"].reserved_cpu == 0  # its room is no longer counted


async def test_a_reconciliation_round_pauses_when_its_slice_is_spent(
    nc: Client, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round pauses _PAUSE_S once its slice passed _SLICE_S, and the loop runs other work
    meanwhile, instead of creates waiting behind a round over hundreds of agents; the stats
    get its work, not its pauses; images are pinned once, not again while they do not change."""
    disks = {f"a{i}": 10 * GB for i in range(6)}
    async with fleet(nc, store, disks), manager(nc, **NO_RECONCILE) as m:
        await wait_for(lambda: len(m.fleet.agents) == 6, 10, "six agents registered")
        await m.sync.reconcile()  # pins the (no) expected images once
        pins: list[str] = []
        real_pin = m.sync._pin_expected

        async def pin(agent_id: str, expected: frozenset[str]) -> None:
            pins.append(agent_id)
            await real_pin(agent_id, expected)

        monkeypatch.setattr(m.sync, "_pin_expected", pin)
        worked: list[float] = []
        monkeypatch.setattr(m.sync, "on_round", worked.append)
        monkeypatch.setattr(agent_sync, "_PAUSE_S", 0.2)
        monkeypatch.setattr(agent_sync, "_SLICE_S", 0.0)  # spent at every agent
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:  # other work, as a create's steps would be
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.05)

        other = asyncio.create_task(ticker())
        m.sync._agreed.clear()
        began = time.monotonic()
        await m.sync.reconcile()
        took = time.monotonic() - began
        stop.set()
        await other
        assert m.sync.visited == 6
        assert took >= 6 * 0.2  # a pause before each agent
        assert ticks >= 6 * 2  # and the loop ran meanwhile (about 4 ticks a pause)
        assert len(worked) == 1 and worked[0] < took - 6 * 0.2 + 0.05  # the pauses left out
        assert pins == []  # nothing changed: no pin, no task
        monkeypatch.setattr(agent_sync, "_PAUSE_S", 2.0)
        monkeypatch.setattr(agent_sync, "_SLICE_S", 60.0)  # never spent: no pause
        m.sync._agreed.clear()
        m.sync._expected_sent.pop("a0")  # as a re-registration forgets what was pinned
        began = time.monotonic()
        await m.sync.reconcile()
        assert m.sync.visited == 6
        assert time.monotonic() - began < 2.0
        assert pins == ["a0"]
