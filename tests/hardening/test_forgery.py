"""Forged and poison events, appended with the agent role's own credentials (and the manager's
for values out of bounds): every reader skips them, the quarantine model shows them with a
reason, and the read models go on following the log."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import duckdb

from domain import events as ev
from domain.agent import Agent
from domain.codec import ACTOR_HEADER, TYPE_HEADER, encode
from domain.session import Session
from domain.subjects import agent_events, session_events
from eventstore.repository import Repository
from eventstore.store import EventStore, Message, Write
from projections import ALL
from projections.runner import Runner
from services.manager.fleet import Fleet
from tests.hardening.conftest import role_store
from tests.projections.conftest import rows
from tests.test_roles import Conn

NOW = datetime.now(UTC)
CAP = ev.Capacity(cpu=4, mem=2**33, disk=2**40)


def _forged(cls: type[ev.Event], version: int = 2, **fields: Any) -> ev.Event:
    return cls(originator_id="B", originator_version=version, timestamp=NOW, **fields)


# Each event type an agent produces, naming agent B, appended on agent A's subject.
AGENT_FORGERIES: dict[str, ev.Event] = {
    "AgentRegistered": _forged(
        ev.AgentRegistered,
        1,
        originator_topic="domain.agent:Agent",
        resource_group="default",
        capacity=CAP,
        runtime="dummy",
    ),
    "AgentReregistered": _forged(
        ev.AgentReregistered, resource_group="evil", capacity=CAP, runtime="dummy"
    ),
    "ImagePullStarted": _forged(ev.ImagePullStarted, image="evil:1", task_id="t-evil"),
    "ImagePulled": _forged(
        ev.ImagePulled,
        image="evil:1",
        task_id="t-evil",
        digest="sha256:e",
        size_bytes=1,
        duration_s=1.0,
    ),
    "ImagePullFailed": _forged(ev.ImagePullFailed, image="evil:1", task_id="t-evil", reason="x"),
    "ImageRemoved": _forged(ev.ImageRemoved, image="base:1", reason="forged"),
    "ImagePreloaded": _forged(ev.ImagePreloaded, image="base:1", reason="forged", pinned=True),
    "AgentLost of B": _forged(ev.AgentLost, status_info="forged"),
    "KernelExited": _forged(
        ev.KernelExited,
        kernel_id="k-evil",
        session_id="s-evil",
        exit_code=0,
        ran_s=1.0,
        reason="exited: code 0",
    ),
}


async def _append(store: EventStore, subject: str, data: bytes, headers: dict[str, str]) -> int:
    [seq] = await store.append([Write(subject, [Message(data, headers)])])
    return seq


async def _forge(store: EventStore, subject: str, event: ev.Event, actor: str) -> int:
    data, headers = encode(event)
    return await _append(store, subject, data, {**headers, ACTOR_HEADER: actor})


async def test_forged_and_poison_events_are_quarantined_by_every_reader(
    conns: dict[str, Conn],
) -> None:
    manager, a_store, b_store = (role_store(conns[r]) for r in ("manager", "A", "B"))
    run = f"{datetime.now(UTC):%H%M%S%f}"  # the module's server is shared: fresh ids
    a_id, b_id = "A", "B"
    for store, agent_id in ((a_store, a_id), (b_store, b_id)):
        repo = Repository(store, actor=f"agent:{agent_id}")
        try:
            agent = await repo.get(Agent, agent_id)
        except LookupError:
            agent = Agent.register(
                agent_id=agent_id,
                resource_group="default",
                capacity=CAP,
                runtime="dummy",
                images={"base:1": {"digest": "sha256:b", "size_bytes": 10}},
            )
        await repo.save(agent)
    session = Session.enqueue(
        owner="alice",
        image="base:1",
        resources={"cpu": 1, "mem": 2**20},
        resource_group="default",
        session_id=f"s{run}",
    )
    [kernel_id] = session.kernels
    session.schedule({kernel_id: b_id})
    await Repository(manager, actor="manager").save(session)

    bad: dict[int, str] = {}  # seq -> what it was
    for name, event in AGENT_FORGERIES.items():
        bad[await _forge(a_store, agent_events(a_id), event, "agent:A")] = name
    # A session's kernel terminated, written by agent A on its own subject.
    terminated = ev.KernelTerminated(
        originator_id=session.id,
        originator_version=3,
        timestamp=NOW,
        kernel_id=kernel_id,
        status_info="forged",
    )
    bad[await _forge(a_store, agent_events(a_id), terminated, "agent:A")] = "KernelTerminated"
    lost_self = ev.AgentLost(
        originator_id=a_id, originator_version=9, timestamp=NOW, status_info="old-style"
    )
    bad[await _forge(a_store, agent_events(a_id), lost_self, "agent:A")] = "AgentLost of A"
    # Malformed: bad JSON, an unknown type, a value out of bounds (and over int64).
    headers = {TYPE_HEADER: "ImagePulled", "Hoist-Schema": "2", ACTOR_HEADER: "agent:A"}
    bad[await _append(a_store, agent_events(a_id), b"{not json", headers)] = "bad JSON"
    unknown = {TYPE_HEADER: "Nope", "Hoist-Schema": "1", ACTOR_HEADER: "agent:A"}
    bad[await _append(a_store, agent_events(a_id), b"{}", unknown)] = "unknown type"
    data, h = encode(
        _forged(ev.AgentReregistered, 3, resource_group="d", capacity=CAP, runtime="x")
    )
    huge = data.replace(b'"originator_id":"B"', b'"originator_id":"A"').replace(
        str(CAP.mem).encode(), str(2**63).encode()
    )
    bad[await _append(a_store, agent_events(a_id), huge, {**h, ACTOR_HEADER: "agent:A"})] = "mem"
    # The manager's own bounds: a session with mem 2**63 and one with a 300 KB owner.
    for sid, what, field, value in (
        (f"m{run}", "mem 2**63", b'"mem":1048576', b'"mem":9223372036854775808'),
        (f"o{run}", "owner 300 KB", b'"owner":"bob"', b'"owner":"' + b"o" * 300_000 + b'"'),
    ):
        enq = Session.enqueue(
            owner="bob",
            image="x:1",
            resources={"cpu": 1, "mem": 2**20},
            resource_group="default",
            session_id=sid,
        )
        [e] = enq.collect_events()
        data, h = encode(e)
        assert field in data
        bad[await _append(manager, session_events(sid), data.replace(field, value), h)] = what

    # The projections: every forgery quarantined with a reason; the models unmoved.
    con = duckdb.connect()
    runner = Runner(con, manager, ALL)
    serving = asyncio.create_task(runner.serve())
    try:
        head = max(bad)
        assert await runner.wait_for(head, 20), "the runner stopped following"
        quarantined = {r["seq"]: r for r in rows(con, "SELECT * FROM quarantine")}
        for seq, what in bad.items():
            assert seq in quarantined, f"{what} (seq {seq}) not quarantined"
            assert quarantined[seq]["reason"], what
            assert quarantined[seq]["subject"] in (
                agent_events(a_id),
                session_events(f"m{run}"),
                session_events(f"o{run}"),
            )
        assert (
            "may not be on hoist.events.agent.*"
            in quarantined[next(s for s, w in bad.items() if w == "KernelTerminated")]["reason"]
        )
        assert (
            "speaks of agent 'B'"
            in quarantined[next(s for s, w in bad.items() if w == "ImagePulled")]["reason"]
        )
        [b_row] = rows(con, f"SELECT * FROM agents WHERE agent_id = '{b_id}'")
        assert b_row["alive"] and b_row["resource_group"] == "default"
        [k] = rows(con, f"SELECT status FROM kernels WHERE kernel_id = '{kernel_id}'")
        assert k["status"] == "SCHEDULED"
        b_images = rows(con, f"SELECT image, pinned FROM agent_images WHERE agent_id = '{b_id}'")
        assert b_images == [{"image": "docker.io/library/base:1", "pinned": False}]
        assert not rows(con, f"SELECT * FROM sessions WHERE session_id IN ('m{run}', 'o{run}')")

        # A later valid event is reflected: the runner still follows.
        b_repo = Repository(b_store, actor="agent:B")
        b = await b_repo.get(Agent, b_id)
        b.pull_started("good:1", f"t{run}")
        [seq] = await b_repo.save(b)
        assert await runner.wait_for(seq, 20)
        assert rows(con, f"SELECT outcome FROM pulls WHERE task_id = 't{run}'") == [
            {"outcome": "pulling"}
        ]
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)

    # The repository: each aggregate loads from the rest of its history.
    repo = Repository(manager)
    a = await repo.get(Agent, a_id)
    assert a.resource_group == "default" and "evil:1" not in a.images
    assert (await repo.get(Session, session.id)).kernels[kernel_id].status == "SCHEDULED"

    # The manager's fold (also what a restarted manager does): the same view.
    fleet = Fleet(manager, repo)
    await fleet.start()
    try:
        assert fleet.agents[b_id].live and fleet.agents[a_id].live
        assert fleet.agents[b_id].agent.images.keys() == {"docker.io/library/base:1"}
        assert fleet.sessions[session.id].kernels[kernel_id].status == "SCHEDULED"
        assert f"m{run}" not in fleet.sessions and f"o{run}" not in fleet.sessions
    finally:
        await fleet.stop()

    # A rebuild (replay, verify) quarantines the same records.
    again = duckdb.connect()
    await Runner(again, manager, ALL).run(follow=False, until_seq=head)
    assert {r["seq"] for r in rows(again, "SELECT seq FROM quarantine")} >= set(bad)
