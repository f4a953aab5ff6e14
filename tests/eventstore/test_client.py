"""Hoist's nats-py client: the same headers as nats-py, and raw subscriptions."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from eventstore.store import EventStore
from services.stack.natsserver import NatsServer
from transport.client import Client, connect, parse_header_lines

# Header lines as they come, and as they should not: odd spacing, colons in values, no colon,
# non-ASCII and invalid UTF-8, whitespace inside names, repeated names, bare line feeds.
_piece = st.sampled_from(
    [b"Nats-Sequence", b"Hoist-Event", b"X", b" ", b"\t", b":", b": ", b"\n", b"\xc3\xa9",
     b"\xff", b"a b", b"1", b"2026-11-29T10:46:32.5Z", b"\x0b", b"", b"\r"]
)  # fmt: skip
_line = st.lists(_piece, max_size=6).map(b"".join)
_block = st.lists(_line, max_size=8).map(lambda lines: b"".join(x + b"\r\n" for x in lines))


@settings(max_examples=500)
@given(_block)
def test_headers_are_parsed_as_nats_py_parses_them(block: bytes) -> None:
    want = NatsClient._parse_header_lines(block)
    assert parse_header_lines(block) == want
    assert parse_header_lines(block) == want  # again: names now come from the cache


def test_the_stores_headers_parse_in_full() -> None:
    block = (
        b"Hoist-Event: KernelCreated\r\nHoist-Schema: 1\r\nNats-Subject: hoist.events.x\r\n"
        b"Nats-Time-Stamp: 2026-11-29T10:46:32.512452864Z\r\nNats-Sequence: 7\r\n\r\n"
    )
    assert parse_header_lines(block) == {
        "Hoist-Event": "KernelCreated",
        "Hoist-Schema": "1",
        "Nats-Subject": "hoist.events.x",
        "Nats-Time-Stamp": "2026-11-29T10:46:32.512452864Z",
        "Nats-Sequence": "7",
    }


async def test_a_raw_subscription_gets_header_blocks_and_payloads(
    nats_server: NatsServer,
) -> None:
    nc = await connect(nats_server.url)
    got: list[tuple[bytes, bytes]] = []
    subjects: list[bytes] = []

    def raw(subject: bytes, headers: bytes | None, data: bytes) -> None:
        subjects.append(subject)
        got.append((headers, data))  # type: ignore[arg-type]

    sub = await nc.subscribe_raw("raw.>", raw)
    msgs: list[Msg] = []

    async def cooked(msg: Msg) -> None:
        msgs.append(msg)

    await nc.subscribe("raw.>", cb=cooked)  # an ordinary subscription beside it
    await nc.publish("raw.a", b"one", headers={"Hoist-Event": "X"})
    await nc.publish("raw.b", b"two")
    await nc.flush()
    for _ in range(200):
        if len(got) == 2 and len(msgs) == 2:
            break
        await asyncio.sleep(0.01)
    assert got[0][0].startswith(b"NATS/1.0\r\n")
    assert parse_header_lines(got[0][0][len(b"NATS/1.0\r\n") :]) == {"Hoist-Event": "X"}
    assert got == [(got[0][0], b"one"), (None, b"two")]
    assert subjects == [b"raw.a", b"raw.b"]
    assert [m.data for m in msgs] == [b"one", b"two"]
    assert msgs[0].headers == {"Hoist-Event": "X"}

    await sub.unsubscribe()
    assert nc._raw == {}  # the handler goes with the subscription
    await nc.publish("raw.c", b"three")
    await nc.flush()
    for _ in range(200):
        if len(msgs) == 3:
            break
        await asyncio.sleep(0.01)
    assert len(got) == 2 and len(msgs) == 3
    await nc.close()


async def test_the_store_refuses_a_plain_nats_py_client(nats_server: NatsServer) -> None:
    plain = NatsClient()
    await plain.connect(nats_server.url)
    try:
        with pytest.raises(TypeError, match=r"transport\.client\.connect"):
            EventStore(plain, "S", ["s.>"])  # type: ignore[arg-type]
    finally:
        await plain.close()
    assert issubclass(Client, NatsClient)
