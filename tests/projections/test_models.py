"""Each read model from scripted event sequences appended through the real event store."""

from __future__ import annotations

import json

import duckdb

from domain.agent import Agent
from domain.image_ref import familiar
from domain.liveness import AgentLiveness
from domain.prepull import PrepullPolicy
from domain.session import Session
from domain.status import KernelStatus as S
from eventstore.repository import Repository
from eventstore.store import EventStore
from projections import ALL
from projections.runner import Runner
from projections.verify import compare, snapshot
from tests.projections.conftest import rebuilt, rows

GIB = 2**30
HUB = "docker.io/library/"  # Docker Hub official images, canonical (domain.image_ref)


async def test_kernels_sessions_and_occupancy(store: EventStore, repo: Repository) -> None:
    session = Session.enqueue(
        owner="alice", image="img:1", resources={"cpu": 2.0, "mem": GIB}, resource_group="rg",
        cluster_size=2,
    )  # fmt: skip
    await repo.save(session)
    k1, k2 = session.kernels
    session.scheduling_failed("no-available-instances")
    session.schedule({k1: "agent-a", k2: "agent-b"})
    session.mark_preparing(k1)
    session.mark_prepared(k1)
    session.mark_creating(k1)
    session.mark_created(k1, "container-1")
    session.mark_preparing(k2)
    session.mark_pulling(k2, "task-1")
    await repo.save(session)

    con = duckdb.connect()
    runner = Runner(con, store, ALL)
    await runner.run(follow=False)

    kernels = {r["kernel_id"]: r for r in rows(con, "SELECT * FROM kernels")}
    assert kernels[k1]["status"] == S.RUNNING and kernels[k1]["container_id"] == "container-1"
    assert kernels[k2]["status"] == S.PULLING and kernels[k2]["pull_task_id"] == "task-1"
    assert kernels[k2]["agent_id"] == "agent-b" and kernels[k2]["owner"] == "alice"
    assert kernels[k1]["running_at"] is not None and kernels[k1]["pulling_at"] is None
    assert kernels[k2]["pending_at"] < kernels[k2]["scheduled_at"] < kernels[k2]["pulling_at"]
    history = rows(
        con, f"SELECT status, status_info FROM kernel_status_history WHERE kernel_id = '{k2}'"
        " ORDER BY seq",
    )  # fmt: skip
    assert [h["status"] for h in history] == [
        "PENDING",
        "PENDING",
        "SCHEDULED",
        "PREPARING",
        "PULLING",
    ]
    assert history[1]["status_info"] == "no-available-instances"
    [srow] = rows(con, "SELECT * FROM sessions")
    assert (srow["status"], srow["status_info"]) == (session.status, session.status_info)
    assert srow["status"] == S.PREPARING or srow["status"] == S.PULLING

    # PULLING holds the agent's slot but is not charged to the user.
    assert rows(con, "SELECT * FROM occupancy_by_owner") == [
        {"owner": "alice", "kernels": 1, "cpu": 2.0, "mem": GIB}
    ]
    by_agent = {r["agent_id"]: r["kernels"] for r in rows(con, "SELECT * FROM occupancy_by_agent")}
    assert by_agent == {"agent-a": 1, "agent-b": 1}

    session.mark_prepared(k2)
    session.mark_creating(k2)
    session.creation_failed(k2, "no such file")
    session.mark_terminating(k1, "user-requested")
    session.mark_terminated(k1, "exited")
    await repo.save(session)
    await runner.run(follow=False)
    [srow] = rows(con, "SELECT * FROM sessions")
    assert srow["status"] == S.ERROR == session.status
    assert rows(con, "SELECT * FROM occupancy_by_owner") == []
    assert rows(con, "SELECT * FROM occupancy_by_agent") == []
    assert rows(con, f"SELECT detail FROM kernels WHERE kernel_id = '{k2}'") == [
        {"detail": "no such file"}
    ]


async def test_agents_images_and_pulls(store: EventStore, repo: Repository) -> None:
    agent = Agent.register(
        agent_id="agent-a",
        resource_group="rg",
        capacity={"cpu": 8, "mem": 8 * GIB, "disk": 10_000},
        runtime="dummy",
        images={"base:1": {"digest": "sha256:b", "size_bytes": 1000}},
    )
    agent.pull_started("img:1", "t1")
    agent.pulled("img:1", "t1", "sha256:1", 3000, 2.5)
    agent.pull_started("img:2", "t2")
    agent.pull_failed("img:2", "t2", "manifest unknown")
    agent.pull_started("img:3", "t3")
    session = Session.enqueue(
        owner="bob", image="img:1", resources={"cpu": 3.0, "mem": GIB}, resource_group="rg"
    )
    (k,) = session.kernels
    session.schedule({k: "agent-a"})
    session.mark_prepared(k)
    await repo.save(agent, session)

    con = duckdb.connect()
    runner = Runner(con, store, ALL)
    await runner.run(follow=False)
    [a] = rows(con, "SELECT * FROM agents_view")
    assert a["alive"] and a["cpu"] == 8 and a["free_cpu"] == 5.0 and a["free_mem"] == 7 * GIB
    assert a["free_disk"] == 10_000 - 1000 - 3000 and a["kernels"] == 1
    # Stored as canonical references (domain.image_ref); the test reads them short.
    images = {familiar(r["image"]): r for r in rows(con, "SELECT * FROM agent_images_view")}
    assert {r["image"] for r in images.values()} == {HUB + "base:1", HUB + "img:1"}
    assert images["img:1"]["kernels_using"] == 1  # PREPARED: holds its agent's room
    assert images["img:1"]["last_used_at"] is None  # but has no container yet
    assert images["img:1"]["pulled_at"] is not None and images["base:1"]["pulled_at"] is None
    assert not images["img:1"]["preloaded"]
    pulls = {r["task_id"]: r for r in rows(con, "SELECT * FROM pulls")}
    assert pulls["t1"]["outcome"] == "pulled" and pulls["t1"]["bytes"] == 3000
    assert pulls["t1"]["duration_s"] == 2.5 and pulls["t1"]["finished_at"] is not None
    assert (pulls["t2"]["outcome"], pulls["t2"]["reason"]) == ("failed", "manifest unknown")
    assert pulls["t3"]["outcome"] == "pulling" and pulls["t3"]["finished_at"] is None

    agent.image_removed("base:1", "gc-disk-pressure")
    await repo.save(agent)
    await repo.save(AgentLiveness.mark_lost(None, agent.id, "heartbeat-timeout"))
    await runner.run(follow=False)
    [a] = rows(con, "SELECT alive, status_info, lost_at FROM agents")
    assert not a["alive"] and a["status_info"] == "heartbeat-timeout" and a["lost_at"]
    assert [r["image"] for r in rows(con, "SELECT image FROM agent_images")] == [HUB + "img:1"]

    # A restarted agent reports its inventory anew; its old process's pull is gone.
    agent.reregister(
        resource_group="rg",
        capacity={"cpu": 4, "mem": 4 * GIB, "disk": 10_000},
        runtime="dummy",
        images={"img:9": {"digest": "sha256:9", "size_bytes": 10}},
    )
    await repo.save(agent)
    runner = Runner(con, store, ALL)  # a restarted runner continues from its checkpoint
    await runner.run(follow=False)
    [a] = rows(con, "SELECT alive, cpu, status_info FROM agents")
    assert a == {"alive": True, "cpu": 4.0, "status_info": "reregistered"}
    assert [r["image"] for r in rows(con, "SELECT image FROM agent_images")] == [HUB + "img:9"]
    [t3] = rows(con, "SELECT outcome, reason FROM pulls WHERE task_id = 't3'")
    assert t3 == {"outcome": "abandoned", "reason": "agent-reregistered"}


async def test_last_used_at_is_when_a_container_used_the_image(
    store: EventStore, repo: Repository
) -> None:
    """Not when a kernel began waiting for its pull (issue 15): a kernel PULLING, PREPARED,
    CREATING, or cancelled while pulling never used the image; one that got a container did."""
    agent = Agent.register(
        agent_id="agent-a",
        resource_group="rg",
        capacity={"cpu": 8, "mem": 8 * GIB, "disk": 10_000},
        runtime="dummy",
    )
    agent.pull_started("img:1", "t1")
    used, cancelled = (
        Session.enqueue(
            owner=owner, image="img:1", resources={"cpu": 1.0, "mem": GIB}, resource_group="rg"
        )
        for owner in ("bob", "carol")
    )
    for session in (used, cancelled):
        (k,) = session.kernels
        session.schedule({k: "agent-a"})
        session.mark_preparing(k)
        session.mark_pulling(k, "t1")
    cancelled.destroy()  # CANCELLED while pulling
    await repo.save(agent, used, cancelled)
    agent.pulled("img:1", "t1", "sha256:1", 3000, 2.5)
    (k,) = used.kernels
    used.mark_prepared(k)
    used.mark_creating(k)
    await repo.save(agent, used)

    con = duckdb.connect()
    runner = Runner(con, store, ALL)
    await runner.run(follow=False)
    [row] = rows(con, "SELECT * FROM agent_images_view")
    assert row["image"] == HUB + "img:1" and row["last_used_at"] is None, row
    used.mark_created(k, "container-1")
    await repo.save(used)
    await runner.run(follow=False)
    [row] = rows(con, "SELECT * FROM agent_images_view")
    assert row["last_used_at"] is not None and row["last_used_at"] > row["pulled_at"], row
    [kernel] = rows(con, f"SELECT running_at FROM kernels WHERE kernel_id = '{k}'")
    assert row["last_used_at"] == kernel["running_at"]


async def test_a_cancelled_pull_is_no_failure(store: EventStore, repo: Repository) -> None:
    agent = Agent.register(
        agent_id="agent-a",
        resource_group="rg",
        capacity={"cpu": 8, "mem": 8 * GIB, "disk": 10_000},
        runtime="dummy",
    )
    agent.pull_started("img:1", "t1")
    agent.pull_failed("img:1", "t1", "no kernel waits for it: k1 cancelled", cancelled=True)
    agent.pull_started("img:2", "t2")
    agent.pull_failed("img:2", "t2", "manifest unknown")
    await repo.save(agent)
    con = duckdb.connect()
    await Runner(con, store, ALL).run(follow=False)
    outcomes = {r["task_id"]: r["outcome"] for r in rows(con, "SELECT * FROM pulls")}
    assert outcomes == {"t1": "cancelled", "t2": "failed"}


async def test_preload_marks_follow_the_agent(store: EventStore, repo: Repository) -> None:
    images = {
        "a:1": {"digest": "sha256:a", "size_bytes": 100},
        "b:1": {"digest": "sha256:b", "size_bytes": 200},
        "c:1": {"digest": "sha256:c", "size_bytes": 300},
        "d:1": {"digest": "sha256:d", "size_bytes": 400},
    }
    agent = Agent.register(
        agent_id="agent-p",
        resource_group="rg",
        capacity={"cpu": 8, "mem": 8 * GIB, "disk": 10_000},
        runtime="dummy",
        images=images,
    )
    agent.mark_preloaded("a:1", "prepull-policy: p1", pinned=False)
    agent.mark_preloaded("b:1", "preload: job j1", pinned=True)
    agent.mark_preloaded("c:1", "prepull-policy: p1", pinned=False)
    agent.mark_preloaded("d:1", "prepull-policy: p2", pinned=False)
    await repo.save(agent)
    con = duckdb.connect()
    runner = Runner(con, store, ALL)
    await runner.run(follow=False)

    def marks() -> dict[str, tuple[bool, bool, str | None]]:
        return {
            familiar(r["image"]): (r["preloaded"], r["pinned"], r["preload_reason"])
            for r in rows(con, "SELECT * FROM agent_images_view")
        }

    assert marks() == {
        "a:1": (True, False, "prepull-policy: p1"),
        "b:1": (True, True, "preload: job j1"),
        "c:1": (True, False, "prepull-policy: p1"),
        "d:1": (True, False, "prepull-policy: p2"),
    }
    # A preload job pins what a policy had preloaded; the pin is the aggregate's too.
    agent.mark_preloaded("a:1", "preload: job j2", pinned=True)
    agent.image_removed("c:1", "gc: disk 91% > 85%")
    await repo.save(agent)
    await runner.run(follow=False)
    assert marks() == {
        "a:1": (True, True, "preload: job j2"),
        "b:1": (True, True, "preload: job j1"),
        "d:1": (True, False, "prepull-policy: p2"),
    }
    assert agent.preloaded == {HUB + "a:1": True, HUB + "b:1": True, HUB + "d:1": False}

    # Restarted: a:1 and d:1 still held (d:1 with a new digest: marks go by name, as in the
    # aggregate), b:1 gone, c:1 back from elsewhere and not preloaded.  The runner restarts
    # from its checkpoint.
    agent.reregister(
        resource_group="rg",
        capacity={"cpu": 8, "mem": 8 * GIB, "disk": 10_000},
        runtime="dummy",
        images={
            "a:1": images["a:1"],
            "c:1": images["c:1"],
            "d:1": {"digest": "sha256:d2", "size_bytes": 450},
        },
    )
    await repo.save(agent)
    runner = Runner(con, store, ALL)
    await runner.run(follow=False)
    assert marks() == {
        "a:1": (True, True, "preload: job j2"),
        "c:1": (False, False, None),
        "d:1": (True, False, "prepull-policy: p2"),
    }
    assert agent.preloaded == {HUB + "a:1": True, HUB + "d:1": False}
    [d1] = rows(con, "SELECT digest, preloaded_at FROM agent_images WHERE image = '" + HUB + "d:1'")
    assert d1["digest"] == "sha256:d2" and d1["preloaded_at"] is not None

    # Removed images lose their mark: pulled again, they are not preloaded.
    agent.image_removed("a:1", "unload-requested: by an admin")
    agent.pull_started("a:1", "t1")
    agent.pulled("a:1", "t1", "sha256:a3", 150, 1.0)
    await repo.save(agent)
    await runner.run(follow=False)
    assert marks()["a:1"] == (False, False, None)
    assert compare(snapshot(con)[1], await rebuilt(store)) == []


async def test_prepull_policies_set_replace_remove(store: EventStore, repo: Repository) -> None:
    gpu = PrepullPolicy.set(
        None,
        name="gpu",
        resource_groups=["gpu", "a100"],
        rules=[{"kind": "newest-tags", "repository": "ml/torch", "count": 3}],
        priority=5,
    )
    everywhere = PrepullPolicy.set(
        None, name="base", resource_groups=[], rules=[{"kind": "images", "images": ["base:1"]}]
    )
    await repo.save(gpu, everywhere)
    con = duckdb.connect()
    runner = Runner(con, store, ALL)
    await runner.run(follow=False)
    policies = {r["name"]: r for r in rows(con, "SELECT * FROM prepull_policies")}
    assert set(policies) == {"gpu", "base"}
    assert json.loads(policies["gpu"]["resource_groups"]) == ["a100", "gpu"]
    assert json.loads(policies["gpu"]["rules"]) == [
        {"kind": "newest-tags", "repository": "docker.io/ml/torch", "count": 3}
    ]
    assert policies["gpu"]["priority"] == 5 and not policies["gpu"]["removed"]
    assert policies["gpu"]["reason"] == "set-by-admin"
    assert json.loads(policies["base"]["resource_groups"]) == []
    created = policies["gpu"]["created_at"]

    PrepullPolicy.set(
        gpu,
        name="gpu",
        resource_groups=["gpu"],
        rules=[{"kind": "large-recent", "min_bytes": 10**9, "days": 7}],
        priority=1,
        reason="tuned",
    )
    everywhere.remove("no longer needed")
    await repo.save(gpu, everywhere)
    runner = Runner(con, store, ALL)  # restarted: the policies come back from the table
    await runner.run(follow=False)
    policies = {r["name"]: r for r in rows(con, "SELECT * FROM prepull_policies")}
    gpu_row = policies["gpu"]
    assert json.loads(gpu_row["rules"]) == [
        {"kind": "large-recent", "min_bytes": 10**9, "days": 7.0}
    ]
    assert (gpu_row["priority"], gpu_row["reason"], gpu_row["removed"]) == (1, "tuned", False)
    assert gpu_row["created_at"] == created < gpu_row["updated_at"]
    assert (policies["base"]["removed"], policies["base"]["reason"]) == (True, "no longer needed")
    assert json.loads(policies["base"]["rules"]) == [
        {"kind": "images", "images": ["docker.io/library/base:1"]}
    ]

    # Set again after its removal: live once more.
    PrepullPolicy.set(
        everywhere, name="base", resource_groups=[], rules=[{"kind": "images", "images": ["b:2"]}]
    )
    await repo.save(everywhere)
    await runner.run(follow=False)
    [base] = rows(con, "SELECT removed, rules FROM prepull_policies WHERE name = 'base'")
    assert not base["removed"] and json.loads(base["rules"])[0]["images"] == [HUB + "b:2"]
    assert compare(snapshot(con)[1], await rebuilt(store)) == []


async def test_slots_an_agent_offers_and_a_kernel_asks_are_in_the_models() -> None:
    from domain.agent import Agent
    from domain.session import Session
    from projections.agents import AgentsProjection
    from projections.sessions import SessionsProjection, slots_text

    assert slots_text({"tpu": 0.5, "gpu": 2}) == "gpu=2, tpu=0.5"
    assert slots_text({}) is None
    agent = Agent.register(
        agent_id="g1",
        resource_group="default",
        capacity={"cpu": 4, "mem": 2**33, "disk": 2**40, "slots": {"gpu": 2}},
        runtime="dummy",
    )
    session = Session.enqueue(
        owner="o",
        image="i:1",
        resources={"cpu": 1, "mem": 2**20, "slots": {"gpu": 1}},
        resource_group="default",
    )
    agents, sessions = AgentsProjection(), SessionsProjection()
    for seq, e in enumerate([*agent.collect_events(), *session.collect_events()], 1):
        for p in (agents, sessions):
            if type(e) in p.handlers:
                p.handlers[type(e)](e, seq)
    assert agents.agents["g1"]["slots"] == "gpu=2"
    [kernel] = sessions.live[session.id].rows.values()
    assert kernel["slots"] == "gpu=1"


async def test_free_slots_are_what_the_kernels_holding_the_agents_room_leave(
    store: EventStore, repo: Repository
) -> None:
    """An agent's free slots, as its free cpu: what it offers less what its kernels in the
    agent-occupying statuses ask (PULLING included: it holds the agent), per slot."""
    capacity = {"cpu": 8, "mem": 8 * GIB, "disk": 2**40, "slots": {"gpu": 4, "tpu": 1.5}}
    g1 = Agent.register(agent_id="g1", resource_group="rg", capacity=capacity, runtime="dummy")
    plain = Agent.register(
        agent_id="p1", resource_group="rg", capacity={"cpu": 1, "mem": GIB, "disk": 1}, runtime="x"
    )

    def session(slots: dict[str, float], cluster_size: int = 1) -> Session:
        s = Session.enqueue(
            owner="o", image="i:1", resources={"cpu": 1, "mem": GIB, "slots": slots},
            resource_group="rg", cluster_size=cluster_size,
        )  # fmt: skip
        s.schedule(dict.fromkeys(s.kernels, "g1"))
        return s

    two = session({"gpu": 0.5, "tpu": 0.25}, cluster_size=2)  # PREPARED: holds g1
    for k in two.kernels:
        two.mark_prepared(k)
    pulling = session({"gpu": 1})
    (k,) = pulling.kernels
    pulling.mark_pulling(k, "t1")
    ended = session({"gpu": 2})
    (k,) = ended.kernels
    ended.cancel(k, "user-request")  # final: holds nothing
    await repo.save(g1, plain, two, pulling, ended)

    con = duckdb.connect()
    await Runner(con, store, ALL).run(follow=False)
    agents = {a["agent_id"]: a for a in rows(con, "SELECT * FROM agents_view")}
    assert agents["g1"]["slot_amounts"] == {"gpu": 4.0, "tpu": 1.5}
    assert agents["g1"]["free_slots"] == {"gpu": 2.0, "tpu": 1.0}
    assert agents["g1"]["free_cpu"] == 5.0  # the same kernels as the cpu's
    assert agents["p1"]["slot_amounts"] == {} and agents["p1"]["free_slots"] == {}
    assert compare(snapshot(con)[1], await rebuilt(store)) == []
