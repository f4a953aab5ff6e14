"""A burst of requests to the stream queues in the store: at most ``in_flight`` await their
answer at once, each timed from when it is sent, so thousands at once wait instead of timing
out behind each other."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from domain import subjects
from domain.subjects import aggregate_subject
from eventstore.store import EventStore, Message, Write
from transport.client import Client


class Counting:
    """Wraps the store's append request: the most awaiting their answer at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    async def around(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.005)  # the answer takes a while: others pile up meanwhile
            return await call(*args, **kwargs)
        finally:
            self.now -= 1


async def test_appends_and_reads_beyond_the_bound_wait_their_turn(nc: Client) -> None:
    store = EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL], in_flight=3)
    await store.ensure_stream()
    counting = Counting()
    request = store._request

    async def counted(*args: Any, **kwargs: Any) -> Any:
        return await counting.around(request, *args, **kwargs)

    store._request = counted  # type: ignore[method-assign]
    writes = [
        [Write(aggregate_subject("session", f"s{i}"), [Message(b"x", {})], expected_last_seq=0)]
        for i in range(40)
    ]
    seqs = await asyncio.gather(*(store.append(w) for w in writes))
    assert sorted(s for (s,) in seqs) == list(range(1, 41))
    assert counting.most == 3  # never more than the bound, and the bound was reached
    histories = await asyncio.gather(
        *(store.read_subject(aggregate_subject("session", f"s{i}")) for i in range(40))
    )
    assert all(len(h) == 1 for h in histories)


def test_the_bound_is_at_least_one(nc: Client) -> None:
    with pytest.raises(ValueError, match="in_flight must be >= 1"):
        EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL], in_flight=0)
