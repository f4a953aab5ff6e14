"""A batched direct get whose reply says more is pending, when asking on finds nothing.

nats-server's Nats-Num-Pending can count messages whose TTL has expired but that are not yet
removed (a lapsed manager lease at the stream's end): the reader used to ask on after them,
get 404, and ask again at full speed for ever (a chaos test hung 300 s in CI).  A responder
speaking the NATS protocol itself plays that server here, on a stream name JetStream does not
hold, so the stale count is certain rather than a race with the TTL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlparse

import pytest

from services.eventstore.store import EventStore
from services.stack.natsserver import NatsServer
from services.transport.client import Client

STREAM = "STALE"
SUBJECT = "stale.a"


class StaleResponder:
    """Answers direct gets of STREAM: from seq 1, one message that claims ``pending`` more,
    then end of batch; from any later seq, 404.  ``asks`` counts the requests."""

    def __init__(self, pending: int) -> None:
        self.pending = pending
        self.asks: list[dict[str, object]] = []
        self._writer: asyncio.StreamWriter | None = None

    async def serve(self, url: str) -> None:
        parsed = urlparse(url)
        reader, self._writer = await asyncio.open_connection(parsed.hostname, parsed.port)
        await reader.readline()  # INFO
        self._writer.write(b'CONNECT {"verbose":false,"headers":true,"no_responders":true}\r\n')
        self._writer.write(f"SUB $JS.API.DIRECT.GET.{STREAM} 1\r\nPING\r\n".encode())
        await self._writer.drain()
        while line := await reader.readline():
            if line.startswith(b"PING"):
                self._writer.write(b"PONG\r\n")
            elif line.startswith(b"MSG "):
                _, _, _, reply, size = line.split()
                body = await reader.readexactly(int(size) + 2)
                await self._answer(reply.decode(), json.loads(body[:-2]))

    async def _answer(self, reply: str, ask: dict[str, object]) -> None:
        self.asks.append(ask)
        if ask.get("seq") == 1:
            self._hpub(
                reply,
                "NATS/1.0\r\n"
                f"Nats-Stream: {STREAM}\r\nNats-Subject: {SUBJECT}\r\nNats-Sequence: 1\r\n"
                "Nats-Time-Stamp: 2026-12-02T00:00:00Z\r\n"
                f"Nats-Num-Pending: {self.pending}\r\n\r\n",
                b"one",
            )
            self._hpub(reply, "NATS/1.0 204 EOB\r\nNats-Num-Pending: 0\r\n\r\n", b"")
        else:
            self._hpub(reply, "NATS/1.0 404 Message Not Found\r\n\r\n", b"")
        assert self._writer is not None
        await self._writer.drain()

    def _hpub(self, subject: str, headers: str, payload: bytes) -> None:
        block = headers.encode()
        assert self._writer is not None
        self._writer.write(
            f"HPUB {subject} {len(block)} {len(block) + len(payload)}\r\n".encode()
            + block
            + payload
            + b"\r\n"
        )


@pytest.fixture
async def responder(nats_server: NatsServer) -> AsyncIterator[StaleResponder]:
    stale = StaleResponder(pending=3)
    task = asyncio.create_task(stale.serve(nats_server.url))
    await asyncio.sleep(0.2)  # subscribed
    yield stale
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_stale_pending_count_ends_the_read(nc: Client, responder: StaleResponder) -> None:
    store = EventStore(nc, STREAM, ["stale.>"], timeout=2.0)
    records = await asyncio.wait_for(store.read(1, 1000), 5)
    assert [(r.seq, r.subject, r.data) for r in records] == [(1, SUBJECT, b"one")]
    # One ask past the message (it found nothing), not one after another.
    assert [a["seq"] for a in responder.asks] == [1, 2], responder.asks[:5]


async def test_a_stale_pending_count_ends_a_replay(nc: Client, responder: StaleResponder) -> None:
    store = EventStore(nc, STREAM, ["stale.>"], timeout=2.0)

    async def replayed() -> list[int]:
        return [r.seq async for r in store.replay()]

    assert await asyncio.wait_for(replayed(), 5) == [1]
    assert len(responder.asks) <= 3, responder.asks[:5]
