"""The shared tail: followers of one store that caught up take one read of each new page."""

from __future__ import annotations

import asyncio

import pytest

from domain.subjects import aggregate_subject
from eventstore import tail as tail_module
from eventstore.store import EventStore, Message, Recorded, Write

A = aggregate_subject("session", "a")
B = aggregate_subject("agent", "b")


async def append(store: EventStore, first: int, count: int) -> None:
    for i in range(first, first + count):
        await store.append([Write(A if i % 2 else B, [Message(str(i).encode())])])


class Follower:
    """Follow the whole log from ``from_seq``, one record at a time, into ``seen``."""

    def __init__(self, store: EventStore, from_seq: int = 1) -> None:
        self.seen: list[int] = []
        self.go = asyncio.Event()
        self.go.set()
        self.more = asyncio.Event()  # set at each record
        self.task = asyncio.create_task(self._run(store, from_seq))

    async def _run(self, store: EventStore, from_seq: int) -> None:
        async for record in store.replay(from_seq=from_seq, follow=True):
            await self.go.wait()
            self.seen.append(record.seq)
            self.more.set()

    async def until(self, seq: int, within: float = 10) -> None:
        async with asyncio.timeout(within):
            while not self.seen or self.seen[-1] < seq:
                self.more.clear()
                await self.more.wait()

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def test_caught_up_followers_share_one_read_and_see_every_record_once(
    store: EventStore,
) -> None:
    await append(store, 1, 50)
    one, two = Follower(store), Follower(store, from_seq=20)
    await one.until(50)
    await two.until(50)
    assert store.tail.followers == 2  # both take the tail's pages now
    reads = 0
    read = store.read

    async def counted(*args: object, **kwargs: object) -> list[Recorded]:
        nonlocal reads
        reads += 1
        return await read(*args, **kwargs)  # type: ignore[arg-type]

    store.read = counted  # type: ignore[method-assign]
    await append(store, 51, 150)
    await one.until(200)
    await two.until(200)
    assert one.seen == list(range(1, 201))
    assert two.seen == list(range(20, 201))
    # One reader of the tail, not two: at most the tail's read per append, plus settle reads.
    assert reads < 150 * 2, reads  # each alone would read at least once an append
    await one.stop()
    await two.stop()
    assert store.tail.followers == 0


async def test_a_follower_far_behind_is_dropped_reads_alone_and_shares_again(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tail_module, "MAX_RECORDS", 5)
    await append(store, 1, 10)
    quick, slow = Follower(store), Follower(store)
    await quick.until(10)
    await slow.until(10)
    slow.go.clear()  # it stops taking records
    await append(store, 11, 40)
    await quick.until(50)  # never held up by the slow one
    assert store.tail.followers == 1  # the slow one was dropped
    slow.go.set()
    await slow.until(50)
    await append(store, 51, 5)
    await quick.until(55)
    await slow.until(55)
    assert quick.seen == slow.seen == list(range(1, 56))  # every record once, in order
    assert store.tail.followers == 2  # caught up again, it shares again
    await quick.stop()
    await slow.stop()


async def test_a_follower_behind_the_tail_reads_the_gap_itself(store: EventStore) -> None:
    await append(store, 1, 5)
    first = Follower(store)
    await first.until(5)
    await append(store, 6, 30)
    await first.until(35)
    late = Follower(store, from_seq=3)  # the tail is at 36: 3..35 are the late one's to read
    await late.until(35)
    await append(store, 36, 3)
    await late.until(38)
    await first.until(38)
    assert late.seen == list(range(3, 39))
    assert first.seen == list(range(1, 39))
    await first.stop()
    await late.stop()


async def test_a_gap_not_yet_appended_is_waited_for_not_skipped(store: EventStore) -> None:
    # A follower from past the head starts the tail there; one behind it must read the gap
    # (not yet appended when it joins) as it comes, not stop at the head and skip it.
    await append(store, 1, 5)
    ahead = Follower(store, from_seq=20)
    await asyncio.sleep(0.2)  # caught up at once: the tail begins at 20
    behind = Follower(store)
    await behind.until(5)
    await append(store, 6, 20)
    await behind.until(25)
    await ahead.until(25)
    assert behind.seen == list(range(1, 26))
    assert ahead.seen == list(range(20, 26))
    await ahead.stop()
    await behind.stop()


async def test_a_follower_that_took_its_time_gets_the_waiting_pages_as_one(
    store: EventStore,
) -> None:
    # As if it read alone: a read model commits per batch, and the tail's small pages one by
    # one kept it behind.
    await append(store, 1, 5)
    quick = Follower(store)
    await quick.until(5)
    sizes: list[int] = []
    go = asyncio.Event()

    async def slow() -> None:
        async for page in store.replay_pages(follow=True):
            sizes.append(len(page))
            if page[-1].seq == 6:  # a page of the tail's: it shares by now
                await go.wait()  # it takes its time while 30 appends come one by one
            if page[-1].seq == 36:
                return

    task = asyncio.create_task(slow())
    await asyncio.sleep(0.2)
    assert store.tail.followers == 2
    await append(store, 6, 1)
    await quick.until(6)
    await append(store, 7, 30)
    await quick.until(36)
    go.set()
    await asyncio.wait_for(task, 5)
    assert sum(sizes) == 36 and len(sizes) <= 4, sizes  # not 30 pages of one
    await quick.stop()
