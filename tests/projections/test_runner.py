"""The runner: exactly-once across crashes, live following, rebuild-and-swap on a version bump,
replay to a point."""

from __future__ import annotations

import asyncio
import random
from typing import Any, ClassVar

import duckdb
import pytest

from domain import events as ev
from domain.codec import encode
from domain.session import Session
from domain.subjects import MANAGER_FENCE_ID, MANAGER_LEASE_ID, manager_fence, manager_lease
from eventstore.repository import Repository
from eventstore.store import MSG_TTL, EventStore, Message, Write
from projections import ALL
from projections import runner as runner_module
from projections.agents import ImagesProjection
from projections.base import Projection
from projections.runner import BUILD_SUFFIX, META, Runner
from projections.sessions import SessionsProjection
from projections.verify import compare, snapshot
from tests.projections.conftest import rebuilt, rows, scripted_history


class Crash(Exception):
    pass


async def test_crashes_anywhere_end_identical_to_a_rebuild(
    store: EventStore, repo: Repository
) -> None:
    last = await scripted_history(repo, sessions=20)
    con = duckdb.connect()
    rng = random.Random(3)
    points: list[str] = []

    def fault(point: str) -> None:
        if rng.random() < 0.15:
            points.append(point)
            raise Crash(point)

    crashes = 0
    while True:
        runner = Runner(con, store, ALL, max_batch=rng.randint(1, 9), fault=fault)
        try:
            if await runner.run(follow=False) >= last or runner.seq >= last:
                break
        except Crash:
            crashes += 1
        if runner.seq >= last:
            break
    assert crashes >= 10, crashes
    assert {"folded", "wrote", "checkpointed"} <= set(points)  # crashed mid-batch, mid-commit
    seq, live = snapshot(con)
    assert seq == last
    assert compare(live, await rebuilt(store)) == []


async def test_follows_live_and_wait_for(store: EventStore, repo: Repository) -> None:
    con = duckdb.connect()
    runner = Runner(con, store, ALL)
    task = asyncio.create_task(runner.run(follow=True))
    try:
        session = Session.enqueue(
            owner="carol", image="img", resources={"cpu": 1, "mem": 1}, resource_group="rg"
        )
        [seq] = await repo.save(session)
        assert await runner.wait_for(seq, 5.0)
        assert rows(con, "SELECT owner, status FROM sessions") == [
            {"owner": "carol", "status": "PENDING"}
        ]
        assert not await runner.wait_for(seq + 1, 0.2)  # nothing more to wait for
    finally:
        task.cancel()


class SessionsNext(SessionsProjection):
    version: ClassVar[int] = SessionsProjection.version + 1


async def test_version_bump_rebuilds_into_fresh_tables_and_swaps(
    store: EventStore, repo: Repository
) -> None:
    last = await scripted_history(repo, sessions=10)
    con = duckdb.connect()
    await Runner(con, store, ALL).run(follow=False)
    before = rows(con, "SELECT * FROM kernels ORDER BY kernel_id")
    seen_during_build: list[int] = []

    def fault(point: str) -> None:
        if point == "folded":  # mid-rebuild: readers still see the whole old model
            cur = con.cursor()
            seen_during_build.append(len(cur.execute("SELECT * FROM kernels").fetchall()))
            [(version,)] = cur.execute(
                f"SELECT version FROM {META} WHERE projection = 'sessions'"
            ).fetchall()
            assert version == SessionsProjection.version

    types: list[type[Projection]] = [SessionsNext if p is SessionsProjection else p for p in ALL]
    runner = Runner(con, store, types, max_batch=5, fault=fault)
    assert runner.building == {"sessions": ["kernels", "kernel_status_history", "sessions"]}
    assert runner.committed["sessions"] == last  # the old model stays visible meanwhile
    await runner.run(follow=False)
    assert len(seen_during_build) > 3 and set(seen_during_build) == {len(before)}
    assert rows(con, f"SELECT version, seq FROM {META} WHERE projection = 'sessions'") == [
        {"version": SessionsNext.version, "seq": last}
    ]
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert not any(t.endswith(BUILD_SUFFIX) for t in tables)
    assert rows(con, "SELECT * FROM kernels ORDER BY kernel_id") == before
    assert rows(con, "SELECT count(*) AS n FROM occupancy_by_owner")[0]["n"] > 0  # views rebound
    seq, live = snapshot(con)
    assert seq == last and compare(live, await rebuilt(store)) == []


async def test_replay_to_a_point_equals_the_state_at_that_point(
    store: EventStore, repo: Repository
) -> None:
    middle = await scripted_history(repo, sessions=8, seed=1)
    at_middle = duckdb.connect()
    await Runner(at_middle, store, ALL).run(follow=False)
    [record] = await store.read_subject("hoist.events.agent.agent-0", after_seq=middle - 1)
    await asyncio.sleep(0.01)  # events after this point have a later store time
    await scripted_history(repo, sessions=8, seed=2, prefix="late")
    _, expected = snapshot(at_middle)

    by_seq = await rebuilt(store, until_seq=middle)
    assert snapshot(by_seq)[0] == middle
    assert compare(expected, by_seq) == []
    by_time = duckdb.connect()
    await Runner(by_time, store, ALL).run(follow=False, until_time=record.time)
    assert compare(expected, by_time) == []
    assert compare(expected, await rebuilt(store)) != []  # the later events do change it


async def test_a_database_from_before_preload_marks_is_rebuilt(
    store: EventStore, repo: Repository
) -> None:
    """Images v1 (no pinned column) and no policies model: opened by this code, the images
    model rebuilds and swaps, the policies model is built from the first event."""
    last = await scripted_history(repo, sessions=6)
    con = duckdb.connect()
    await Runner(con, store, ALL).run(follow=False)
    for sql in [  # what the previous release left
        f"UPDATE {META} SET version = 1 WHERE projection = 'images'",
        "DROP VIEW agent_images_view",
        "ALTER TABLE agent_images DROP COLUMN pinned",
        "ALTER TABLE agent_images DROP COLUMN preload_reason",
        "ALTER TABLE agent_images DROP COLUMN preloaded_at",
        "UPDATE agent_images SET preloaded = false",
        f"DELETE FROM {META} WHERE projection = 'policies'",
        "DROP TABLE prepull_policies",
    ]:
        con.execute(sql)

    runner = Runner(con, store, ALL)
    assert runner.building == {"images": ["agent_images"]}
    assert runner.committed["images"] == last and runner.committed["policies"] == 0
    await runner.run(follow=False)
    assert rows(con, f"SELECT version, seq FROM {META} WHERE projection = 'images'") == [
        {"version": ImagesProjection.version, "seq": last}
    ]
    assert rows(
        con, "SELECT agent_id, pinned, preload_reason FROM agent_images_view WHERE preloaded"
    ) == [{"agent_id": "agent-1", "pinned": True, "preload_reason": "preload: job j1"}]
    assert rows(con, "SELECT name, removed FROM prepull_policies") == [
        {"name": "agent-policy", "removed": False}
    ]
    seq, live = snapshot(con)
    assert seq == last and compare(live, await rebuilt(store)) == []


async def test_the_managers_lease_leaves_nothing_a_rebuild_after_it_expired_would_miss(
    store: EventStore, repo: Repository
) -> None:
    """Lease and fence messages expire (Nats-TTL): folded live, they must leave no row that a
    rebuild after they lapsed would lack (the aggregate_versions row of CI's chaos failure)."""
    session = Session.enqueue(
        owner="carol", image="img", resources={"cpu": 1, "mem": 1}, resource_group="rg"
    )
    await repo.save(session)
    leased = []
    for cls, aggregate_id, subject in (
        (ev.ManagerLeaseTaken, MANAGER_LEASE_ID, manager_lease()),
        (ev.ManagerFence, MANAGER_FENCE_ID, manager_fence()),
    ):
        fields = {"ttl_s": 1.0} if cls is ev.ManagerLeaseTaken else {"term_seq": 1}
        event = cls(
            originator_id=aggregate_id,
            originator_version=1,
            timestamp=cls.create_timestamp(),
            holder="m1",
            **fields,
        )
        data, headers = encode(event)
        headers[MSG_TTL] = "1s"
        leased.append(Write(subject, [Message(data, headers)]))
    [*_, last] = await store.append(leased)
    con = duckdb.connect()
    assert await Runner(con, store, ALL).run(follow=False) == last
    _, live = snapshot(con)
    for _ in range(50):  # until nats-server expired both
        if await store.last(manager_fence(), expiring=True) is None:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the fence never expired")
    assert compare(live, await rebuilt(store)) == []
    assert rows(con, "SELECT count(*) AS n FROM quarantine") == [{"n": 0}]


async def test_a_trickle_is_committed_at_the_pace_and_a_waiting_query_is_not_kept(
    store: EventStore, repo: Repository
) -> None:
    """Following a trickle of single appends, the runner pauses after each commit so that
    commits take at most ``commit_share`` of the time, what arrives meanwhile joining the next;
    a query that waits for a sequence ends the pause at once."""
    con = duckdb.connect()
    runner = Runner(con, store, ALL, commit_share=0.005, share=False)
    commits: list[float] = []
    loop = asyncio.get_running_loop()

    def counted(point: str) -> None:
        if point == "committed":
            commits.append(loop.time())

    runner.fault = counted
    reads: list[float] = []
    read = store.read

    async def counted_read(*args: Any, **kwargs: Any) -> Any:
        reads.append(loop.time())
        return await read(*args, **kwargs)

    store.read = counted_read  # type: ignore[method-assign]
    task = asyncio.create_task(runner.run(follow=True))
    try:
        sessions = []
        started = loop.time()
        for i in range(20):  # one append every 50 ms for a second
            session = Session.enqueue(
                owner=f"u{i}", image="img", resources={"cpu": 1, "mem": 1}, resource_group="rg"
            )
            [seq] = await repo.save(session)
            sessions.append(seq)
            await asyncio.sleep(0.05)
        assert await runner.wait_for(sessions[-1], 5.0)
        took = loop.time() - started
        paced = [t for t in commits if t >= started]
        # unpaced, each append is its own commit (20); paced, a commit of a few ms pauses ~1 s
        assert len(paced) <= 8, (len(paced), took)
        # and the reads wait out the pause too: what arrived meanwhile comes in one read (and
        # its settle re-reads), not in one or more per append (59 without it)
        assert len([t for t in reads if t >= started]) <= 4 * len(paced) + 4, (reads, paced)
        assert rows(con, "SELECT count(*) AS n FROM sessions") == [{"n": 20}]
        # a waiting query is answered without waiting out the pace
        session = Session.enqueue(
            owner="late", image="img", resources={"cpu": 1, "mem": 1}, resource_group="rg"
        )
        [seq] = await repo.save(session)
        await asyncio.sleep(0.1)  # the runner has it, and waits out the pace
        asked = loop.time()
        assert await runner.wait_for(seq, 5.0)
        assert loop.time() - asked < 0.5  # the pause would hold it up to 1 s
    finally:
        task.cancel()


async def test_a_runner_behind_reads_on_and_only_a_caught_up_one_waits_out_the_pause(
    store: EventStore, repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Following, a runner that falls behind (10,000 events at once, short of the bulk reader's
    threshold) reads full pages back to back while it commits: only a caught-up runner's reads
    wait out its pause, so catching up takes a few commits, not one per page."""

    def enqueued(n: int) -> list[Session]:
        return [
            Session.enqueue(
                owner=f"u{i}", image="img", resources={"cpu": 1, "mem": 1}, resource_group="rg"
            )
            for i in range(n)
        ]

    # Pauses of 5 s (the saves below fit in one): a commit of a ms or more, 10,000 times over;
    # only from the commit of the first event on (none to wait out before it).
    monkeypatch.setattr(runner_module, "MAX_PAUSE_S", 0.05)
    con = duckdb.connect()
    runner = Runner(con, store, ALL, commit_share=0.0001, share=False)
    commits: list[str] = []
    runner.fault = lambda point: commits.append(point) if point == "committed" else None
    task = asyncio.create_task(runner.run(follow=True))
    try:
        async with asyncio.timeout(60):
            while not commits:  # noqa: ASYNC110 - its first commit (of nothing) has no event
                await asyncio.sleep(0.01)
        monkeypatch.setattr(runner_module, "MAX_PAUSE_S", 5.0)
        [first] = await repo.save(*enqueued(1))
        await committed(runner, first)
        commits.clear()  # caught up: its reads wait out the pause after this commit
        read = store.read
        asked: list[int] = []  # where each read starts

        async def slow_read(from_seq: int, *args: Any, **kwargs: Any) -> Any:
            asked.append(from_seq)
            await asyncio.sleep(0.15)  # a read longer than a fold and a commit of its page
            return await read(from_seq, *args, **kwargs)

        store.read = slow_read  # type: ignore[method-assign]
        last = 0
        for _ in range(10):  # ten full pages
            *_, last = await repo.save(*enqueued(1_000))
        # A read past them starts once the last page is queued for the fold (the store reads
        # a page ahead; the runner queues each page as it comes).  Then the pause under way is
        # not waited out: a query waits for them (the commits they took are counted by then).
        async with asyncio.timeout(60):
            while not asked or asked[-1] <= last:  # noqa: ASYNC110 - no event to wait on
                await asyncio.sleep(0.01)
        assert await runner.wait_for(last, 60)
        # Waiting after each full page too, it took a commit every page or two (4 or 5).
        assert len(commits) <= 2, commits
        assert rows(con, "SELECT count(*) AS n FROM sessions") == [{"n": 10_001}]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def committed(runner: Runner, seq: int) -> None:
    """Until the runner's models reflect ``seq``; not wait_for, which ends its pauses."""
    async with asyncio.timeout(60):
        while runner.seq < seq:  # noqa: ASYNC110 - the runner has no event to wait on here
            await asyncio.sleep(0.01)
