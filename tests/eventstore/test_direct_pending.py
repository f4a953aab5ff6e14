"""A batched direct get whose reply says more is pending, when asking on finds nothing.

nats-server's Nats-Num-Pending can count messages whose TTL has expired but that are not yet
removed (a lapsed manager lease at the stream's end): the reader used to ask on after them,
get 404, and ask again at full speed for ever (a chaos test hung 300 s in CI).  A replica behind
the one that counted answers the same; asked again, it has the message.  A responder
speaking the NATS protocol itself plays that server here, on a stream name JetStream does not
hold, so the stale count is certain rather than a race with the TTL.  It also plays a moment in
which no replica serves direct gets (503), which a read rides out for a few seconds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlparse

import pytest

from eventstore import reads as reads_module
from eventstore.reads import _UNSERVED_PAUSES
from eventstore.store import EventStore, StoreUnavailable
from services.stack.natsserver import NatsServer
from transport.client import Client

STREAM = "STALE"
SUBJECT = "stale.a"
LAST = f"$JS.API.DIRECT.GET.{STREAM}."  # + the subject: a request for its last message


class StaleResponder:
    """Answers direct gets of STREAM: from seq 1, one message that claims ``pending`` more,
    then end of batch; from seq 2, 404 the first ``lagging`` times (a replica behind), then the
    second message if ``second``, else 404 for ever (the stale count).  The first ``unserved``
    asks get 503 (no replica serves direct gets yet).  ``asks`` holds the requests; ``ready`` is
    set once the responder is subscribed."""

    def __init__(
        self, pending: int, lagging: int = 0, second: bool = False, unserved: int = 0
    ) -> None:
        self.pending = pending
        self.lagging = lagging
        self.second = second
        self.unserved = unserved
        self.asks: list[dict[str, object]] = []
        self.ready = asyncio.Event()
        self._writer: asyncio.StreamWriter | None = None

    async def serve(self, url: str) -> None:
        parsed = urlparse(url)
        reader, self._writer = await asyncio.open_connection(parsed.hostname, parsed.port)
        await reader.readline()  # INFO
        self._writer.write(b'CONNECT {"verbose":false,"headers":true,"no_responders":true}\r\n')
        self._writer.write(f"SUB $JS.API.DIRECT.GET.{STREAM} 1\r\n".encode())
        self._writer.write(f"SUB $JS.API.DIRECT.GET.{STREAM}.> 2\r\nPING\r\n".encode())
        await self._writer.drain()
        while line := await reader.readline():
            if line.startswith(b"PONG"):  # the server has our SUB: it came before the PING
                self.ready.set()
            elif line.startswith(b"PING"):
                self._writer.write(b"PONG\r\n")
            elif line.startswith(b"MSG "):
                _, subject, _, reply, size = line.split()
                body = (await reader.readexactly(int(size) + 2))[:-2]
                # a last message's subject is in the request's own (store.last)
                ask = json.loads(body) if body else {"last_by_subj": subject.decode()[len(LAST) :]}
                await self._answer(reply.decode(), ask)

    async def _answer(self, reply: str, ask: dict[str, object]) -> None:
        self.asks.append(ask)
        seq = ask.get("seq")
        if len(self.asks) <= self.unserved:
            self._hpub(reply, "NATS/1.0 503\r\n\r\n", b"")
        elif seq == 1 or "last_by_subj" in ask:
            self._stored(reply, 1, b"one", self.pending)
        elif seq == 2 and self.second and len(self.asks) > 1 + self.lagging:
            self._stored(reply, 2, b"two", 0)
        else:
            self._hpub(reply, "NATS/1.0 404 Message Not Found\r\n\r\n", b"")
        assert self._writer is not None
        await self._writer.drain()

    def _stored(self, reply: str, seq: int, data: bytes, pending: int) -> None:
        """A batch of one stored message, then its end."""
        self._hpub(
            reply,
            "NATS/1.0\r\n"
            f"Nats-Stream: {STREAM}\r\nNats-Subject: {SUBJECT}\r\nNats-Sequence: {seq}\r\n"
            "Nats-Time-Stamp: 2026-12-02T00:00:00Z\r\n"
            f"Nats-Num-Pending: {pending}\r\n\r\n",
            data,
        )
        self._hpub(reply, "NATS/1.0 204 EOB\r\nNats-Num-Pending: 0\r\n\r\n", b"")

    def _hpub(self, subject: str, headers: str, payload: bytes) -> None:
        block = headers.encode()
        assert self._writer is not None
        self._writer.write(
            f"HPUB {subject} {len(block)} {len(block) + len(payload)}\r\n".encode()
            + block
            + payload
            + b"\r\n"
        )


@asynccontextmanager
async def responding(url: str, stale: StaleResponder) -> AsyncIterator[StaleResponder]:
    task = asyncio.create_task(stale.serve(url))
    try:
        await asyncio.wait_for(stale.ready.wait(), 10)
        yield stale
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
async def responder(nats_server: NatsServer) -> AsyncIterator[StaleResponder]:
    async with responding(nats_server.url, StaleResponder(pending=3)) as stale:
        yield stale


async def test_a_stale_pending_count_ends_the_read(nc: Client, responder: StaleResponder) -> None:
    store = EventStore(nc, STREAM, ["stale.>"], timeout=2.0)
    records = await asyncio.wait_for(store.read(1, 1000), 5)
    assert [(r.seq, r.subject, r.data) for r in records] == [(1, SUBJECT, b"one")]
    # A few asks past the message (each found nothing), then the read ends.
    assert [a["seq"] for a in responder.asks] == [1, 2, 2, 2, 2], responder.asks[:8]


async def test_a_replica_behind_is_asked_again(nats_server: NatsServer, nc: Client) -> None:
    """The count was true, the replica that answered next was behind: asked again, it has it."""
    lagging = StaleResponder(pending=1, lagging=2, second=True)
    async with responding(nats_server.url, lagging):
        store = EventStore(nc, STREAM, ["stale.>"], timeout=2.0)
        records = await asyncio.wait_for(store.read(1, 1000), 5)
    assert [(r.seq, r.data) for r in records] == [(1, b"one"), (2, b"two")]
    assert [a["seq"] for a in lagging.asks] == [1, 2, 2, 2], lagging.asks


async def test_a_stale_pending_count_ends_a_replay(nc: Client, responder: StaleResponder) -> None:
    store = EventStore(nc, STREAM, ["stale.>"], timeout=2.0)

    async def replayed() -> list[int]:
        return [r.seq async for r in store.replay()]

    assert await asyncio.wait_for(replayed(), 5) == [1]
    assert len(responder.asks) == 5, responder.asks[:8]


async def test_a_moment_without_a_serving_replica_is_ridden_out(
    nats_server: NatsServer, nc: Client
) -> None:
    """503 (no replica serves direct gets: a node that just restarted, CI once read through one
    then) is asked again after a pause, not raised at once."""
    unserved = StaleResponder(pending=0, unserved=3)
    async with responding(nats_server.url, unserved):
        store = EventStore(nc, STREAM, ["stale.>"], timeout=2.0)
        records = await asyncio.wait_for(store.read(1, 1000), 10)
    assert [(r.seq, r.data) for r in records] == [(1, b"one")]
    assert [a["seq"] for a in unserved.asks] == [1, 1, 1, 1], unserved.asks


async def test_no_serving_replica_for_seconds_is_unavailable(
    nats_server: NatsServer, nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sum(_UNSERVED_PAUSES) >= 3  # a read rides out seconds of 503 (a node restarting)
    # The same schedule a tenth as long here: the asks are counted, not the seconds.
    monkeypatch.setattr(reads_module, "_UNSERVED_PAUSES", tuple(p / 10 for p in _UNSERVED_PAUSES))
    never = StaleResponder(pending=0, unserved=1_000)
    async with responding(nats_server.url, never):
        store = EventStore(nc, STREAM, ["stale.>"], timeout=2.0)
        with pytest.raises(StoreUnavailable, match="no replica of it serves them now"):
            await asyncio.wait_for(store.read_subject(SUBJECT), 15)
    assert len(never.asks) == len(_UNSERVED_PAUSES) + 1, never.asks


async def test_an_urgent_read_is_not_held_up_by_503(nats_server: NatsServer, nc: Client) -> None:
    """The managers' lease is read ``urgent``: its loop asks again on its own clock (a renewal
    every TTL/4), so a read of it fails at once rather than riding 503 out past the TTL; a
    plain read of the last message rides it out."""
    never = StaleResponder(pending=0, unserved=1_000)
    async with responding(nats_server.url, never):
        store = EventStore(nc, STREAM, ["stale.>"], timeout=2.0)
        with pytest.raises(StoreUnavailable, match="no replica of it serves them now"):
            await asyncio.wait_for(store.last(SUBJECT, urgent=True, expiring=True), 1)
        assert len(never.asks) == 1, never.asks
    twice = StaleResponder(pending=0, unserved=2)
    async with responding(nats_server.url, twice):
        store = EventStore(nc, STREAM, ["stale.>"], timeout=2.0)
        last = await asyncio.wait_for(store.last(SUBJECT), 10)
    assert last is not None and last.data == b"one"
    assert twice.asks == [{"last_by_subj": SUBJECT}] * 3, twice.asks
