"""Replay (from/until a sequence, one aggregate, follow mode) and bounded reads."""

from __future__ import annotations

import asyncio

import pytest

from domain.subjects import aggregate_subject
from eventstore import reads as reads_module
from eventstore.store import MAX_BATCH, EventStore, Message, Recorded, Write

A = aggregate_subject("session", "a")
B = aggregate_subject("agent", "b")


async def fill(store: EventStore, n: int) -> None:
    """n messages alternating between A (even) and B (odd), payload = index."""
    for i in range(n):
        await store.append([Write(A if i % 2 == 0 else B, [Message(str(i).encode())])])


async def collect(store: EventStore, **kwargs: object) -> list[Recorded]:
    return [r async for r in store.replay(**kwargs)]  # type: ignore[arg-type]


async def test_empty_stream_replays_nothing_at_once(store: EventStore) -> None:
    assert await asyncio.wait_for(collect(store), 2) == []
    assert await asyncio.wait_for(collect(store, subject_filter=A), 2) == []


async def test_replay_all_in_stream_order(store: EventStore) -> None:
    await fill(store, 10)
    records = await collect(store)
    assert [r.seq for r in records] == list(range(1, 11))
    assert [r.data for r in records] == [str(i).encode() for i in range(10)]
    assert [r.subject for r in records[:2]] == [A, B]
    assert records[0].time <= records[-1].time


async def test_replay_from_and_until_a_sequence(store: EventStore) -> None:
    await fill(store, 10)
    assert [r.seq for r in await collect(store, from_seq=7)] == [7, 8, 9, 10]
    assert [r.seq for r in await collect(store, until_seq=3)] == [1, 2, 3]
    assert [r.seq for r in await collect(store, from_seq=4, until_seq=6)] == [4, 5, 6]
    assert await asyncio.wait_for(collect(store, from_seq=11), 2) == []


async def test_replay_one_aggregate(store: EventStore) -> None:
    await fill(store, 10)
    records = await collect(store, subject_filter=B)
    assert [r.seq for r in records] == [2, 4, 6, 8, 10]
    assert {r.subject for r in records} == {B}
    assert [r.seq for r in await collect(store, subject_filter=B, from_seq=5)] == [6, 8, 10]


async def test_follow_sees_new_appends(store: EventStore) -> None:
    await fill(store, 3)
    seen: list[int] = []
    caught_up = asyncio.Event()

    async def follow() -> None:
        async for r in store.replay(follow=True):
            seen.append(r.seq)
            if r.seq == 3:
                caught_up.set()
            if r.seq == 5:
                return

    task = asyncio.create_task(follow())
    await asyncio.wait_for(caught_up.wait(), 5)
    await store.append([Write(A, [Message(b"new1"), Message(b"new2")])])
    await asyncio.wait_for(task, 5)
    assert seen == [1, 2, 3, 4, 5]


async def test_reads_share_one_subscription_for_their_answers(store: EventStore) -> None:
    await fill(store, 5)
    await store.read(1, 1)
    subs = len(store.nc._subs)
    for _ in range(20):  # pages and lasts: their answers all come to the one
        assert [r.seq for r in await store.read(2, 3)] == [2, 3, 4]
        assert (await store.last(B)) is not None
    assert len(store.nc._subs) == subs and store.nc.replies_waiting == 0
    for _ in range(20):  # a store per request (the web view's history) on the one connection
        other = EventStore(store.nc, store.stream, store.subjects)
        assert [r.seq for r in await other.read(2, 1)] == [2]
    assert len(store.nc._subs) == subs  # the connection's one, not one per store


async def test_a_follow_settling_after_a_signal_takes_the_next_message_at_once(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Settle pauses and a poll far longer than the test may wait: only the next message's
    # signal can end the wait that follows the first message's read.
    monkeypatch.setattr(reads_module, "_SETTLE", (60.0, 60.0, 60.0))
    monkeypatch.setattr(reads_module, "_FOLLOW_POLL", 60.0)
    first = asyncio.Event()
    seen: list[bytes] = []

    async def follow() -> None:
        async for r in store.replay(follow=True):
            seen.append(r.data)
            first.set()
            if len(seen) == 2:
                return

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.2)  # following, waiting for a signal
    await store.append([Write(A, [Message(b"one")])])
    await asyncio.wait_for(first.wait(), 5)
    await asyncio.sleep(0.2)  # now in the first settle pause
    await store.append([Write(A, [Message(b"two")])])
    await asyncio.wait_for(task, 5)  # the pause slept through, it took 60 s
    assert seen == [b"one", b"two"]


async def test_follow_on_an_empty_stream_waits_for_the_first_append(store: EventStore) -> None:
    async def first() -> Recorded:
        async for r in store.replay(follow=True, subject_filter=A):
            return r
        raise AssertionError("follow ended")

    task = asyncio.create_task(first())
    await asyncio.sleep(0.2)
    assert not task.done()
    await store.append([Write(B, [Message(b"other")]), Write(A, [Message(b"mine")])])
    record = await asyncio.wait_for(task, 5)
    assert (record.seq, record.data) == (2, b"mine")


async def test_filtered_replay_stops_before_passing_until_seq(store: EventStore) -> None:
    await fill(store, 10)
    assert [r.seq for r in await collect(store, subject_filter=B, until_seq=5)] == [2, 4]
    assert [r.seq for r in await collect(store, from_seq=3, until_seq=2)] == []


async def test_filtered_replay_with_nothing_at_until_seq_skips_later_messages(
    store: EventStore,
) -> None:
    await fill(store, 10)  # B holds 2, 4, 6, 8, 10; nothing of B sits at 3, 5 or 7
    assert [r.seq for r in await collect(store, subject_filter=B, from_seq=3, until_seq=7)] == [
        4,
        6,
    ]
    assert await collect(store, subject_filter=B, from_seq=3, until_seq=3) == []
    assert [r.seq for r in await collect(store, subject_filter=A, until_seq=8)] == [1, 3, 5, 7]


async def test_filtered_follow_ends_at_until_seq_the_stream_already_holds(
    store: EventStore,
) -> None:
    await fill(store, 10)
    records = await asyncio.wait_for(
        collect(store, subject_filter=B, from_seq=1, until_seq=9, follow=True), 5
    )
    assert [r.seq for r in records] == [2, 4, 6, 8]


async def test_read_is_a_bounded_page_in_stream_order(store: EventStore) -> None:
    await fill(store, 10)
    assert [r.seq for r in await store.read(1, 3)] == [1, 2, 3]
    assert [r.seq for r in await store.read(8, 5)] == [8, 9, 10]  # fewer: the stream ends
    assert [r.seq for r in await store.read(3, 2, subject_filter=B)] == [4, 6]
    assert [r.data for r in await store.read(5, 1, subject_filter=A)] == [b"4"]
    assert await store.read(11, 5) == []
    assert await store.read(1, 0) == []
    page = await store.read(1, 1)
    assert page[0].subject == A and "Nats-Sequence" not in page[0].headers


async def test_read_sends_only_the_page_not_the_rest_of_the_stream(store: EventStore) -> None:
    await store.append([Write(A, [Message(str(i).encode()) for i in range(MAX_BATCH)])])
    await store.append([Write(B, [Message(str(i).encode()) for i in range(500)])])
    before = store.nc.stats["in_msgs"]
    page = await store.read(1, 10)
    received = store.nc.stats["in_msgs"] - before
    assert [r.seq for r in page] == list(range(1, 11))
    assert received <= 11  # the 10 messages and the end-of-batch status
    # A page larger than one direct-get batch is fetched in several, and still stops at limit.
    big = await store.read(2, 1200)
    assert [r.seq for r in big] == list(range(2, 1202))
    assert [r.seq for r in await store.read(1, 600, subject_filter=B)] == list(range(1001, 1501))


async def test_read_names_bad_arguments(store: EventStore) -> None:
    with pytest.raises(ValueError, match="from_seq"):
        await store.read(0, 5)
    with pytest.raises(ValueError, match="limit"):
        await store.read(1, -1)
