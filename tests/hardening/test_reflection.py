"""nats-server answers a JetStream request on whatever reply subject the requester names,
unchecked: a reader can have a direct get's answer (a stored message, headers and all) land on
a subject the event stream captures, where nats-server stores it again.  A hostile agent can
so place, through a client, its own quarantined forgery on a session's or its liveness
subject.  The store marks such copies and every reader refuses them; liveness counts no
reflected beat."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import duckdb

from domain import events as ev
from domain import rpc
from domain.admission import Inadmissible, admit
from domain.codec import REFLECTED_HEADER, encode
from domain.rpc import BEAT_HEADER
from domain.session import Session
from domain.subjects import EVENT_STREAM, agent_events, liveness_events, session_events
from eventstore.repository import Repository
from eventstore.store import EventStore, Message, Write
from projections import ALL
from projections.runner import Runner
from services.cli.progress_view import SessionState, _follow_progress
from services.manager.fleet import Fleet
from services.manager.liveness import LivenessWatcher
from tests.hardening.conftest import role_store
from tests.projections.conftest import rows
from tests.test_roles import Conn, _connect

MiB = 1024**2


async def _reflect(client: Conn, store: EventStore, seq: int, target: str) -> int:
    """Have nats-server answer a direct get for ``seq`` on ``target``; the copy's seq."""
    head = await store.head()
    await client.nc.publish(
        f"$JS.API.DIRECT.GET.{EVENT_STREAM}", json.dumps({"seq": seq}).encode(), reply=target
    )
    for _ in range(200):
        if await store.head() > head:
            return head + 1
        await asyncio.sleep(0.01)
    raise AssertionError("the reflected answer was not stored")


async def test_a_reflected_forgery_is_refused_by_every_reader(
    stack: Any, conns: dict[str, Conn]
) -> None:
    manager, a_store = role_store(conns["manager"]), role_store(conns["A"])
    repo = Repository(manager)
    session = Session.enqueue(
        owner="ann", image="img:1", resources={"cpu": 1, "mem": MiB}, resource_group="rg"
    )
    (kernel,) = session.kernels
    session.schedule({kernel: "B"})
    await repo.save(session)
    # Agent A forges the kernel's end on its own subject: quarantined there, as every forgery.
    forged = ev.KernelTerminated(
        originator_id=session.id,
        originator_version=3,
        timestamp=datetime.now(UTC),
        kernel_id=kernel,
        status_info="forged-by-A",
    )
    data, headers = encode(forged)
    [forged_seq] = await a_store.append([Write(agent_events("A"), [Message(data, headers)])])
    lost = ev.AgentLost(
        originator_id="B", originator_version=1, timestamp=datetime.now(UTC), status_info="forged"
    )
    data, headers = encode(lost)
    [lost_seq] = await a_store.append([Write(agent_events("A"), [Message(data, headers)])])

    # Only the log's own account can still reflect (readers and agents are in accounts without
    # JetStream, tests/hardening/test_flood.py): the manager's user stands in for a bug there.
    client = await _connect(stack, "manager")
    try:
        copy = await _reflect(client, manager, forged_seq, session_events(session.id))
        lost_copy = await _reflect(client, manager, lost_seq, liveness_events("B"))
    finally:
        await client.nc.close()

    # The copies are in the log, on the subjects they were aimed at, marked by the store.
    [record] = await manager.read_subject(session_events(session.id), copy - 1)
    assert record.seq == copy and record.headers[REFLECTED_HEADER] == str(forged_seq)
    last = await manager.last(liveness_events("B"))
    assert last is not None and last.headers[REFLECTED_HEADER] == str(lost_seq)
    try:
        admit(record.subject, record.headers, record.data)
        raise AssertionError("a reflected copy was admitted")
    except Inadmissible as e:
        assert f"a copy of stream record {forged_seq}" in e.reason

    # Every reader refuses them: repository, the manager's fleet, the read models.
    assert (await repo.get(Session, session.id)).kernels[kernel].status.value == "SCHEDULED"
    fleet = Fleet(manager, repo)
    await fleet.start()
    try:
        assert fleet.sessions[session.id].kernels[kernel].status.value == "SCHEDULED"
        assert "B" not in fleet.liveness
    finally:
        await fleet.stop()
    con = duckdb.connect()
    await Runner(con, manager, ALL).run(follow=False)
    assert rows(con, "SELECT status FROM kernels") == [{"status": "SCHEDULED"}]
    quarantined = {r["seq"] for r in rows(con, "SELECT seq FROM quarantine")}
    assert {forged_seq, lost_seq, copy, lost_copy} <= quarantined


async def test_a_reflected_heartbeat_keeps_no_agent_alive(
    stack: Any, conns: dict[str, Conn]
) -> None:
    # A well-formed beat of agent B, stored where a client can direct-get it (here: the log),
    # reflected onto B's heartbeat subject, is not a beat: B is marked lost all the same.
    manager = role_store(conns["manager"])
    beat = {
        "agent_id": "B",
        "sent_at": datetime.now(UTC).isoformat(),
        "kernels": [],
        "free": {"cpu": 1, "mem": 1, "disk": 1},
        "images": [],
        "pulls": {},
    }
    # Stored as a beat would be sent, header and all (the store adds its own when it answers).
    [stored] = await role_store(conns["A"]).append(
        [Write(agent_events("A"), [Message(json.dumps(beat).encode(), {BEAT_HEADER: "1"})])]
    )
    # The watcher's clock moves 0.1 s per reflection, once the watcher took it: its deadline
    # passes on its time, whatever the host's load (a late round of its own would be a stall,
    # after which it judges nobody).
    now = [1000.0]
    watcher = LivenessWatcher(
        conns["manager"].nc,
        Repository(manager),
        deadline_s=0.5,
        check_interval_s=0.05,
        clock=lambda: now[0],
    )
    taken = [0]
    on_heartbeat = watcher._on_heartbeat

    async def counted(msg: Any) -> None:
        await on_heartbeat(msg)
        taken[0] += 1

    watcher._on_heartbeat = counted  # type: ignore[method-assign]
    await watcher.start(known_agents=["B"])
    # Only the log's own account can still reflect (readers and agents are in accounts without
    # JetStream, tests/hardening/test_flood.py): the manager's user stands in for a bug there.
    client = await _connect(stack, "manager")
    try:
        for i in range(12):  # with the server's headers, and without any (no_hdr)
            request = {"seq": stored, "no_hdr": True} if i % 2 else {"seq": stored}
            await client.nc.publish(
                f"$JS.API.DIRECT.GET.{EVENT_STREAM}",
                json.dumps(request).encode(),
                reply="hoist.heartbeat.B",
            )
            async with asyncio.timeout(10):
                while taken[0] <= i:  # noqa: ASYNC110 - the watcher has no event to wait on
                    await asyncio.sleep(0.01)
            now[0] += 0.1
            await watcher.check()
        assert "B" not in watcher.last_beat
        # Judged silent, marked lost.  (B never registered, so the watcher records nothing:
        # what B's liveness subject holds is the reflected copy the test above may have left.)
        assert "B" in watcher.marked
    finally:
        await client.nc.close()
        await watcher.stop()


async def test_progress_counts_only_on_its_own_agents_subject(
    stack: Any, conns: dict[str, Conn]
) -> None:
    # Agent B may publish progress only under hoist.progress.B.>; a payload there naming agent
    # A's pull is not A's progress.
    session = Session.enqueue(
        owner="ann", image="img:1", resources={"cpu": 1, "mem": MiB}, resource_group="rg"
    )
    (kernel,) = session.kernels
    session.schedule({kernel: "A"})
    session.mark_pulling(kernel, task_id="t1")
    state = SessionState(session.id)
    for event in session.collect_events():
        state.apply_event(event)  # type: ignore[arg-type]
    # Only the log's own account can still reflect (readers and agents are in accounts without
    # JetStream, tests/hardening/test_flood.py): the manager's user stands in for a bug there.
    client = await _connect(stack, "manager")
    changed, new_pulls = asyncio.Event(), asyncio.Event()
    follow = asyncio.create_task(
        _follow_progress(SimpleNamespace(nc=client.nc), state, changed, new_pulls)  # type: ignore[arg-type]
    )
    try:
        await asyncio.sleep(0.2)  # subscribed

        def progress(current: int) -> bytes:
            return rpc.encode(
                rpc.PullProgress(
                    agent_id="A", task_id="t1", image="img:1", layers=[], current=current, total=9
                )
            )

        await conns["B"].nc.publish("hoist.progress.B.t1", progress(8))  # forged
        await asyncio.sleep(0.5)
        assert state.pulls == {}
        await conns["A"].nc.publish("hoist.progress.A.t1", progress(3))  # its own
        for _ in range(100):
            if state.pulls:
                break
            await asyncio.sleep(0.02)
        assert state.pulls[("A", "t1")].current == 3
    finally:
        follow.cancel()
        await client.nc.close()
