"""Replay at the caller's pace: a slow caller gets every message exactly once, in order, and
nothing is sent to it ahead of what it reads (no client buffer to overflow)."""

from __future__ import annotations

import asyncio

from domain.subjects import aggregate_subject
from eventstore.store import MAX_BATCH, EventStore, Message, Recorded, Write

A = aggregate_subject("session", "a")
B = aggregate_subject("agent", "b")


async def fill(store: EventStore, n: int, subject: str = A) -> None:
    """n messages on ``subject`` in atomic batches, payload = their index."""
    for start in range(0, n, MAX_BATCH):
        messages = [Message(str(i).encode()) for i in range(start, min(start + MAX_BATCH, n))]
        await store.append([Write(subject, messages)])


async def test_a_slow_caller_gets_a_stream_larger_than_any_buffer_whole(store: EventStore) -> None:
    n = 70_000  # more than nats-py's 65,536-message buffer the replay used to overflow
    await fill(store, n)
    seqs: list[int] = []
    async for record in store.replay():
        seqs.append(record.seq)
        if len(seqs) % 25_000 == 1:
            await asyncio.sleep(0.3)  # the caller writes a batch somewhere slow
        else:
            await asyncio.sleep(0)
    assert seqs == list(range(1, n + 1))


async def test_nothing_is_sent_ahead_of_what_the_caller_reads(store: EventStore) -> None:
    await fill(store, 10 * MAX_BATCH)
    replay = store.replay()
    first = await anext(replay)
    before = store.nc.stats["in_msgs"]
    await asyncio.sleep(0.5)  # the caller is busy; a pushing consumer would fill our buffer
    received = store.nc.stats["in_msgs"] - before
    rest = [r.seq async for r in replay]
    assert received <= 2 * MAX_BATCH + 2  # at most the page read ahead (and its end status)
    assert [first.seq, *rest] == list(range(1, 10 * MAX_BATCH + 1))


async def test_follow_survives_a_burst_while_the_caller_is_slow(store: EventStore) -> None:
    await fill(store, 5)
    seen: list[Recorded] = []
    caught_up = asyncio.Event()
    total = 5 + 3 * MAX_BATCH + 1

    async def follow() -> None:
        async for record in store.replay(follow=True, subject_filter=A):
            seen.append(record)
            if record.seq == 5:
                caught_up.set()
            await asyncio.sleep(0.1 if record.seq % 1000 == 0 else 0)
            if len(seen) == total:
                return

    task = asyncio.create_task(follow())
    await asyncio.wait_for(caught_up.wait(), 5)
    await fill(store, 3 * MAX_BATCH)  # faster than the follower reads
    await store.append([Write(B, [Message(b"not followed")])])
    await store.append([Write(A, [Message(b"last")])])
    await asyncio.wait_for(task, 30)
    assert [r.seq for r in seen] == [*range(1, 3 * MAX_BATCH + 6), 3 * MAX_BATCH + 7]
    assert seen[-1].data == b"last"


async def test_follow_picks_up_single_appends_one_after_another(store: EventStore) -> None:
    got: asyncio.Queue[Recorded] = asyncio.Queue()

    async def follow() -> None:
        async for record in store.replay(follow=True):
            got.put_nowait(record)

    task = asyncio.create_task(follow())
    try:
        for i in range(20):
            [seq] = await store.append([Write(A if i % 2 else B, [Message(str(i).encode())])])
            record = await asyncio.wait_for(got.get(), 5)
            assert (record.seq, record.data) == (seq, str(i).encode())
    finally:
        task.cancel()
    assert got.empty()


async def test_follow_until_seq_ends_there(store: EventStore) -> None:
    await fill(store, 3)

    async def until_5() -> list[int]:
        return [r.seq async for r in store.replay(from_seq=2, until_seq=5, follow=True)]

    task = asyncio.create_task(until_5())
    await asyncio.sleep(0.1)
    assert not task.done()
    await fill(store, 4)
    assert await asyncio.wait_for(task, 5) == [2, 3, 4, 5]


async def test_filtered_follow_ends_once_the_stream_passes_until_seq(store: EventStore) -> None:
    await fill(store, 3, B)

    async def of_a() -> list[Recorded]:
        return [r async for r in store.replay(subject_filter=A, until_seq=5, follow=True)]

    task = asyncio.create_task(of_a())
    await asyncio.sleep(0.1)
    assert not task.done()
    await store.append([Write(A, [Message(b"a4")])])
    await store.append([Write(B, [Message(b"b5"), Message(b"b6")])])  # nothing of A at 5
    records = await asyncio.wait_for(task, 5)
    assert [(r.seq, r.data) for r in records] == [(4, b"a4")]


async def test_abandoned_replay_leaves_no_subscription(store: EventStore) -> None:
    await fill(store, 3 * MAX_BATCH)
    await store.read(1, 1)  # the store's one subscription for the answers to its reads
    subs = len(store.nc._subs)
    replay = store.replay(follow=True)
    assert (await anext(replay)).seq == 1
    await replay.aclose()
    assert len(store.nc._subs) == subs
    assert store.nc.replies_waiting == 0  # no read left waiting for answers
