"""Version gaps, appended by an agent on its own subject with its own credentials: every
reader (the projection runner, the repository, the manager's fleet) skips the same event, and
the agent's next real event (its aggregate's last admitted version + 1) is taken by all of
them.  The runner keeps each aggregate's version across restarts and rebuilds.  The quarantine
shows who can have written a record (``writer``) beside who it claims (``actor``)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import duckdb

from domain import events as ev
from domain.agent import Agent
from domain.codec import ACTOR_HEADER, encode
from domain.image_ref import familiar
from domain.subjects import agent_events
from eventstore.repository import Repository
from eventstore.store import EventStore, Message, Write
from projections import ALL
from projections.agents import ImagesProjection
from projections.base import Projection
from projections.quarantine import QuarantineProjection
from projections.runner import Runner
from projections.verify import compare, snapshot
from services.manager.fleet import Fleet
from services.manager.queries import QUERIES, _answer_query
from tests.hardening.conftest import role_store
from tests.projections.conftest import rebuilt, rows
from tests.test_roles import Conn

NOW = datetime.now(UTC)
CAP = ev.Capacity(cpu=4, mem=2**33, disk=2**40)
SUBJECT = agent_events("A")


async def _forge(store: EventStore, event: ev.Event, actor: str) -> int:
    data, headers = encode(event)
    [seq] = await store.append([Write(SUBJECT, [Message(data, {**headers, ACTOR_HEADER: actor})])])
    return seq


def _pulled(version: int, image: str) -> ev.ImagePulled:
    return ev.ImagePulled(
        originator_id="A",
        originator_version=version,
        timestamp=NOW,
        image=image,
        task_id="t-gap",
        digest="sha256:gap",
        size_bytes=1,
        duration_s=1.0,
    )


async def _run(con: duckdb.DuckDBPyConnection, store: EventStore, **kw: Any) -> Runner:
    runner = Runner(con, store, ALL, **kw)
    await runner.run(follow=False)
    return runner


def _images(con: duckdb.DuckDBPyConnection) -> set[str]:
    # Short names (domain.image_ref.familiar): the model holds canonical ones.
    rows_ = rows(con, "SELECT image FROM agent_images WHERE agent_id = 'A'")
    return {familiar(r["image"]) for r in rows_}


def _quarantine(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    return rows(con, "SELECT seq, event_type, reason, actor, writer FROM quarantine ORDER BY seq")


class ImagesV2(ImagesProjection):
    version: ClassVar[int] = ImagesProjection.version + 1


class QuarantineV3(QuarantineProjection):
    version: ClassVar[int] = QuarantineProjection.version + 1


def _with(*classes: type[Projection]) -> list[type[Projection]]:
    by_name = {c.name: c for c in classes}
    return [by_name.get(p.name, p) for p in ALL]


async def test_version_gaps_are_refused_alike_by_every_reader(
    conns: dict[str, Conn], tmp_path: Path
) -> None:
    manager, a_store = role_store(conns["manager"]), role_store(conns["A"])
    a_repo = Repository(a_store, actor="agent:A")
    agent = Agent.register(
        agent_id="A",
        resource_group="default",
        capacity=CAP,
        runtime="dummy",
        images={"base:1": {"digest": "sha256:b", "size_bytes": 10}},
    )
    for i in range(13):  # versions 2..14
        agent.pull_started(f"real:{i}", f"t{i}")
    await a_repo.save(agent)
    assert agent.version == 14

    db = str(tmp_path / "models.duckdb")
    con = duckdb.connect(db)
    runner = await _run(con, manager)
    assert (
        rows(con, "SELECT version FROM aggregate_versions WHERE subject = 'hoist.events.agent.A'")[
            0
        ]["version"]
        == 14
    )

    # A well-formed ImagePulled about itself, 50 versions ahead; and a forged loss claiming
    # to be the manager's.
    gap = await _forge(a_store, _pulled(64, "gap:1"), "agent:A")
    lost = await _forge(
        a_store,
        ev.AgentLost(originator_id="A", originator_version=15, timestamp=NOW, status_info="x"),
        "manager",
    )
    # The agent's next real event: version 15, as its own aggregate (and every reader) has it.
    agent = await a_repo.get(Agent, "A")
    assert agent.version == 14
    agent.pulled("real:0", "t0", "sha256:r0", 5, 0.5)
    [real] = await a_repo.save(agent)
    await runner.run(follow=False)

    quarantine = {r["seq"]: r for r in _quarantine(con)}
    assert quarantine[gap] == {
        "seq": gap,
        "event_type": "ImagePulled",
        "reason": "version gap: ImagePulled is version 64, hoist.events.agent.A is at 14",
        "actor": "agent:A",
        "writer": "agent:A",
    }
    assert quarantine[lost]["actor"] == "manager" and quarantine[lost]["writer"] == "agent:A"
    assert "AgentLost may not be on hoist.events.agent.*" in quarantine[lost]["reason"]
    assert real not in quarantine
    assert "gap:1" not in _images(con) and "real:0" in _images(con)
    [pull] = rows(con, "SELECT outcome FROM pulls WHERE agent_id = 'A' AND task_id = 't0'")
    assert pull["outcome"] == "pulled"

    # The repository and the manager's fleet: the same version, the same images.
    loaded = await Repository(manager).get(Agent, "A")
    assert loaded.version == 15 and {"gap:1", "real:0"} & set(map(familiar, loaded.images)) == {
        "real:0"
    }
    fleet = Fleet(manager, Repository(manager))
    await fleet.start()
    try:
        assert fleet.agents["A"].agent.version == 15
        assert fleet.agents["A"].agent.images.keys() == loaded.images.keys()
    finally:
        await fleet.stop()

    # Restarted from its checkpoint, the runner still knows A is at 15: a replayed version 15
    # and a version 17 (both before the real 16) are gaps, version 16 is taken.
    con.close()
    con = duckdb.connect(db)
    runner = Runner(con, manager, ALL)
    assert runner.seq == real
    again = await _forge(a_store, _pulled(15, "again:1"), "agent:A")
    ahead = await _forge(a_store, _pulled(17, "ahead:1"), "agent:A")
    agent = await a_repo.get(Agent, "A")
    agent.pulled("real:1", "t1", "sha256:r1", 5, 0.5)
    [real16] = await a_repo.save(agent)
    assert agent.version == 16
    await runner.run(follow=False)
    quarantine = {r["seq"]: r["reason"] for r in _quarantine(con)}
    assert quarantine[again] == (
        "version gap: ImagePulled is version 15, hoist.events.agent.A is at 15"
    )
    assert quarantine[ahead] == (
        "version gap: ImagePulled is version 17, hoist.events.agent.A is at 15"
    )
    assert real16 not in quarantine
    assert _images(con) & {"gap:1", "again:1", "ahead:1", "real:1"} == {"real:1"}
    assert (await Repository(manager).get(Agent, "A")).images.keys() == {
        r["image"] for r in rows(con, "SELECT image FROM agent_images WHERE agent_id = 'A'")
    }

    # A rebuild from scratch (replay, verify) yields the same quarantine and versions.
    seq, live = snapshot(con)
    assert seq == real16
    assert compare(live, await rebuilt(manager)) == []

    # A model rebuilt behind the quarantine takes its decisions (no versions decided again);
    # the quarantine rebuilt behind the others decides them again, the same way.
    for types in ((ImagesV2,), (ImagesV2, QuarantineV3)):
        cls = types[-1]
        runner = Runner(con, manager, _with(*types), max_batch=3)
        assert list(runner.building) == [cls.name]
        await runner.run(follow=False)
        assert not runner.building
        seq, live = snapshot(con)
        assert seq == real16 and compare(live, await rebuilt(manager)) == []
        assert "gap:1" not in _images(con)
    con.close()


async def test_live_runner_follows_past_a_gap(conns: dict[str, Conn]) -> None:
    """Following live (small batches), the gap is skipped and the next event applied."""
    manager, a_store = role_store(conns["manager"]), role_store(conns["A"])
    a_repo = Repository(a_store, actor="agent:A")
    con = duckdb.connect()
    runner = Runner(con, manager, ALL)
    serving = asyncio.create_task(runner.serve())
    try:
        try:
            agent = await a_repo.get(Agent, "A")  # the module's server: the first test made it
        except LookupError:
            agent = Agent.register(
                agent_id="A", resource_group="default", capacity=CAP, runtime="dummy"
            )
            await a_repo.save(agent)
        gap = await _forge(a_store, _pulled(agent.version + 2, "live-gap:1"), "agent:A")
        agent = await a_repo.get(Agent, "A")
        agent.pull_started("live:1", "tl")
        agent.pulled("live:1", "tl", "sha256:l", 5, 0.5)
        seq = (await a_repo.save(agent))[-1]
        assert await runner.wait_for(seq, 20)
        [row] = rows(con, f"SELECT reason, writer FROM quarantine WHERE seq = {gap}")
        assert row["reason"].startswith("version gap: ImagePulled is version")
        assert row["writer"] == "agent:A"
        assert "live:1" in _images(con) and "live-gap:1" not in _images(con)
        # The quarantine query filters by writer (who can have written it).
        q = QUERIES["quarantine"]
        reply = await _answer_query(runner, "quarantine", q, {"writer": "agent:A"})
        assert gap in {r["seq"] for r in reply["rows"]}
        assert {r["writer"] for r in reply["rows"]} == {"agent:A"}
        reply = await _answer_query(runner, "quarantine", q, {"writer": "manager"})
        assert gap not in {r["seq"] for r in reply["rows"]}
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
