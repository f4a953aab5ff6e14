"""Resource groups on a real nats-server: a create for a group its owner may not use is refused
(``forbidden``, seed 004's check_scaling_group) with nothing appended; a group no admin defined,
a public one and a removed one are open to everyone; the definitions are events in the log,
folded again after a restart; ``group.list`` shows each group's users and live agents."""

from __future__ import annotations

import asyncio
from typing import Any

from domain import subjects
from domain.agent import Agent
from domain.codec import TYPE_HEADER
from domain.liveness import AgentLiveness
from domain.subjects import GROUP_LIST, GROUP_REMOVE, GROUP_SET, SESSION_CREATE
from eventstore.repository import Repository
from eventstore.store import EventStore
from services.manager.main import Manager
from tests.agent.agent_harness import wait_for
from tests.manager.harness import GB, agents, create, create_payload, manager, request, until
from transport.client import Client


async def set_group(nc: Client, **fields: Any) -> dict[str, Any]:
    reply = await request(nc, GROUP_SET, fields)
    assert "error" not in reply, reply
    return reply  # type: ignore[no-any-return]


def running(s: dict[str, Any]) -> bool:
    return s["status"] == "RUNNING"


async def joined_once(store: EventStore, m: Manager, group: str) -> None:
    """An agent joined ``group`` and was lost since: the group is known, with no live agent."""
    agent_id = f"{group}-1"
    repository = Repository(store, actor="manager")
    capacity = {"cpu": 4, "mem": GB, "disk": 16 * GB}
    await repository.save(
        Agent.register(agent_id=agent_id, resource_group=group, capacity=capacity, runtime="dummy")
    )
    await repository.save(AgentLiveness.mark_lost(None, agent_id, "heartbeat-timeout: a test"))

    def lost() -> bool:
        state = m.fleet.agents.get(agent_id)
        return state is not None and not state.live

    await wait_for(lost, 10, f"{agent_id} joined {group} and lost")


async def test_only_a_groups_users_create_sessions_in_it(nc: Client, store: EventStore) -> None:
    async with (
        agents(nc, store, ["g1"], resource_group="gpu", cpu=8),
        agents(nc, store, ["d1"], cpu=4),
        manager(nc) as m,
    ):
        await set_group(nc, name="gpu", users=["alice"], description="the A100s")
        alice = await create(nc, resource_group="gpu")
        view = await until(nc, alice["session_id"], running, what="alice runs in gpu")
        assert view["kernels"][0]["agent_id"] == "g1"

        before = await store.last_seq(f"{subjects.EVENTS}.session.>")
        sessions = set(m.fleet.sessions)
        refused = await request(
            nc, SESSION_CREATE, create_payload(owner="bob", resource_group="gpu")
        )
        assert refused["error"]["code"] == "forbidden", refused
        assert refused["error"]["message"] == (
            "resource_group: 'bob' may not use resource group 'gpu' (an admin defined who may);"
            " groups 'bob' may use: 'default', and any group no admin defined"
        )
        assert await store.last_seq(f"{subjects.EVENTS}.session.>") == before  # nothing appended
        assert set(m.fleet.sessions) == sessions

        bob = await create(nc, owner="bob")  # default: no admin defined it, open to everyone
        await until(nc, bob["session_id"], running, what="bob runs in default")
        await joined_once(store, m, "nobody-defined-it")
        undefined = await create(nc, owner="bob", resource_group="nobody-defined-it")
        assert undefined["status"] == "PENDING"  # accepted; it waits for an agent of the group

        listed = await request(nc, GROUP_LIST, {})
        groups = {g["name"]: g for g in listed["groups"]}
        # defined ones and the agents' groups (lost agents' too)
        assert set(groups) == {"default", "gpu", "nobody-defined-it"}
        gpu = groups["gpu"]
        assert (gpu["defined"], gpu["access"], gpu["users"]) == (True, "users", ["alice"])
        assert gpu["description"] == "the A100s"
        assert gpu["agents"] == [{"agent_id": "g1", "cpu": 8.0, "mem": 8 * GB, "slots": {}}]
        assert gpu["capacity"] == {"cpu": 8.0, "mem": 8 * GB, "slots": {}}
        default = groups["default"]
        assert (default["defined"], default["access"]) == (False, "everyone")
        assert [a["agent_id"] for a in default["agents"]] == ["d1"]


async def test_a_public_group_and_a_removed_one_are_open_to_everyone(
    nc: Client, store: EventStore
) -> None:
    async with (
        agents(nc, store, ["l1"], resource_group="lab"),
        agents(nc, store, ["g1"], resource_group="gpu"),
        manager(nc),
    ):
        await set_group(nc, name="lab", public=True)
        carol = await create(nc, owner="carol", resource_group="lab")
        await until(nc, carol["session_id"], running)

        await set_group(nc, name="gpu")  # neither users nor public: nobody
        closed = await request(nc, SESSION_CREATE, create_payload(resource_group="gpu"))
        assert closed["error"]["code"] == "forbidden"
        assert "groups 'alice' may use: 'lab', and any" in closed["error"]["message"]

        removed = await request(nc, GROUP_REMOVE, {"name": "gpu"})
        assert removed == {"group": "gpu", "recorded": True}
        again = await create(nc, resource_group="gpu")  # open again, as never defined
        await until(nc, again["session_id"], running)
        listed = {g["name"]: g for g in (await request(nc, GROUP_LIST, {}))["groups"]}
        assert listed["gpu"]["removed"] and listed["gpu"]["access"] == "everyone"
        assert listed["lab"]["access"] == "everyone" and listed["lab"]["public"]


async def test_set_and_remove_are_events_in_the_log_and_folded_after_a_restart(
    nc: Client, store: EventStore
) -> None:
    async with manager(nc) as m:
        first = await set_group(nc, name="gpu", users=["bob", "alice"])
        assert first["recorded"] and first["group"]["users"] == ["alice", "bob"]
        same = await set_group(nc, name="gpu", users=["alice", "bob"])
        assert not same["recorded"]  # the same definition: nothing new
        await set_group(nc, name="gpu", users=["alice"])
        assert (await request(nc, GROUP_REMOVE, {"name": "gpu"}))["recorded"]
        missing = await request(nc, GROUP_REMOVE, {"name": "gpu"})
        assert missing["error"]["code"] == "not-found"
        never = await request(nc, GROUP_REMOVE, {"name": "default"})
        assert never["error"]["code"] == "not-found"
        await set_group(nc, name="lab", users=["carol"])
        bad = await request(nc, GROUP_SET, {"name": "not a token"})
        assert bad["error"]["code"] == "invalid-request"
        both = await request(nc, GROUP_SET, {"name": "x", "users": ["a"], "public": True})
        assert both["error"]["code"] == "invalid-request"
        assert both["error"]["message"].startswith("users: ")
        records = await store.read_subject(f"{subjects.EVENTS}.resource-group.gpu")
        assert [r.headers[TYPE_HEADER] for r in records] == [
            "ResourceGroupSet",
            "ResourceGroupSet",
            "ResourceGroupRemoved",
        ]
        assert m.fleet.resource_groups["gpu"].removed
    async with agents(nc, store, ["l1"], resource_group="lab"), manager(nc) as again_m:
        assert again_m.fleet.resource_groups["gpu"].removed  # a restart folds the same groups
        assert again_m.fleet.resource_groups["lab"].users == ["carol"]
        refused = await request(nc, SESSION_CREATE, create_payload(resource_group="lab"))
        assert refused["error"]["code"] == "forbidden"
        carol = await create(nc, owner="carol", resource_group="lab")
        await until(nc, carol["session_id"], running)
        await asyncio.sleep(0)


async def test_a_group_nobody_defined_or_joined_is_refused_naming_the_nearest(
    nc: Client, store: EventStore
) -> None:
    """A misspelt group fails at create (``invalid-request`` naming ``resource_group``, the
    nearest known names, nothing appended); a group an admin defined, or one an agent joined
    (lost now), has no live agent and is waited for with its reason."""
    async with agents(nc, store, ["g1"], resource_group="gpu"), manager(nc) as m:
        await joined_once(store, m, "lab")
        await set_group(nc, name="night", public=True)  # defined, no agent ever
        before = await store.last_seq(f"{subjects.EVENTS}.session.>")
        for misspelt, near in [("gpuu", "did you mean 'gpu'? "), ("zzz", "")]:
            refused = await request(nc, SESSION_CREATE, create_payload(resource_group=misspelt))
            assert refused["error"] == {
                "code": "invalid-request",
                "message": f"resource_group: no resource group {misspelt!r} is known (no admin"
                f" defined it and no agent joined it); {near}`hoist group list` shows them",
            }, refused
        assert await store.last_seq(f"{subjects.EVENTS}.session.>") == before  # nothing appended
        assert m.fleet.sessions == {}
        for group in ("lab", "night"):
            waiting = await create(nc, resource_group=group, max_wait=0.3)
            assert waiting["status"] == "PENDING", waiting
            assert waiting["status_info"].startswith(
                f"no-available-instances: resource group {group!r} has no live agents"
            ), waiting
        gpu = await create(nc, resource_group="gpu", max_wait=5)
        assert gpu["status"] == "RUNNING", gpu
