"""A flood of JetStream API requests aimed at the log (issue 39): a client, an admin, a Hoist
user and an agent each ask nats-server's JetStream API, for a while, with reply subjects on
every ``hoist.events.>`` family. Their accounts have no JetStream (services/stack/natsauth.py),
so no answer lands in the HOIST stream: 0 records appended. ``bench/flood.py`` runs it for 30 s
on a full stack, with creates timed during and without it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from domain import subjects
from domain.subjects import EVENT_STREAM, PROGRESS_STREAM
from eventstore.store import Message, Write
from services.stack.natsauth import set_user
from tests.hardening.conftest import role_store
from tests.test_roles import Conn, _as_user, _connect, _reload
from transport.client import Client

FLOOD_S = 8.0  # the test's window (the benchmark's is 30 s)
FLUSH_EVERY = 200  # publishes between flushes: the server keeps up, the client's buffer bounded


def targets(own_agent: str | None = None) -> list[str]:
    """A reply subject on every family of the log: sessions, agents, liveness, policies, groups,
    users, dotfiles, reservations, the lease, the fence and the term (an agent's own subject
    left out: it is the agent's to write)."""
    out = [
        subjects.session_events("flooded"),
        subjects.agent_events("B"),
        subjects.liveness_events("B"),
        f"{subjects.EVENTS}.{subjects.PREPULL_POLICY}.p",
        f"{subjects.EVENTS}.{subjects.RESOURCE_POLICY}.p",
        f"{subjects.EVENTS}.{subjects.RESOURCE_GROUP}.g",
        f"{subjects.EVENTS}.{subjects.USER}.flooded",
        f"{subjects.EVENTS}.{subjects.DOTFILES}.flooded",
        subjects.reservation_events("B"),
        subjects.manager_lease(),
        subjects.manager_fence(),
        subjects.manager_term(),
    ]
    if own_agent != "A":
        out.append(subjects.agent_events("A"))
    return out


def requests(seq: int) -> list[tuple[str, bytes]]:
    """JetStream API requests any role might send: infos and direct gets of both streams."""
    one = json.dumps({"seq": seq}).encode()
    return [
        (f"$JS.API.STREAM.INFO.{EVENT_STREAM}", b""),
        ("$JS.API.INFO", b""),
        (f"$JS.API.DIRECT.GET.{EVENT_STREAM}", one),
        (f"$JS.API.DIRECT.GET.{EVENT_STREAM}", json.dumps({"seq": seq, "no_hdr": True}).encode()),
        (f"$JS.API.DIRECT.GET.{EVENT_STREAM}", json.dumps({"seq": 1, "batch": 4}).encode()),
        (f"$JS.API.DIRECT.GET.{EVENT_STREAM}.{subjects.agent_events('A')}", b""),
        (f"$JS.API.DIRECT.GET.{PROGRESS_STREAM}", json.dumps({"seq": 1}).encode()),
    ]


async def flood(nc: Client, aims: list[str], seq: int, until: float) -> int:
    """Send every request with every reply subject of ``aims`` until ``until``; how many."""
    sent = 0
    asks = requests(seq)
    while time.monotonic() < until:
        for subject, payload in asks:
            for reply in aims:
                await nc.publish(subject, payload, reply=reply)
                sent += 1
                if sent % FLUSH_EVERY == 0:
                    await nc.flush()
    await nc.flush()
    return sent


@pytest.fixture
async def flooders(stack: Any, conns: dict[str, Conn]) -> AsyncIterator[dict[str, Conn]]:
    set_user(stack.data_dir, "flooder")
    await _reload(stack)
    out = {
        "client": await _connect(stack, "client"),
        "admin": await _connect(stack, "admin"),
        "user flooder": await _as_user(stack, "flooder"),
        "agent A": conns["A"],
    }
    yield out
    for name, conn in out.items():
        if name != "agent A":
            await conn.nc.close()


async def test_a_flood_of_aimed_jetstream_requests_appends_nothing(
    conns: dict[str, Conn], flooders: dict[str, Conn]
) -> None:
    manager = role_store(conns["manager"])
    # Something to reflect: agent A's fact on its own subject (a direct get answers with it).
    [seq] = await role_store(conns["A"]).append(
        [Write(subjects.agent_events("A"), [Message(b'{"forged": true}', {})])]
    )
    js = conns["manager"].nc.jetstream()
    # The server does answer them: in the readers' account, where the client may listen.
    landed = [0]

    async def count(_: Any) -> None:
        landed[0] += 1

    heard = await flooders["client"].nc.subscribe(subjects.session_events("flooded"), cb=count)
    await flooders["client"].nc.flush()
    before = (await js.stream_info(EVENT_STREAM)).state
    until = time.monotonic() + FLOOD_S
    sent = await asyncio.gather(
        *(
            flood(conn.nc, targets("A" if name == "agent A" else None), seq, until)
            for name, conn in flooders.items()
        )
    )
    # Each connection's requests were taken by the server (a round trip after its flood), and
    # a moment for the answers under way to land wherever they would.
    for conn in flooders.values():
        await conn.nc.flush(timeout=30)
    await asyncio.sleep(0.5)
    after = (await js.stream_info(EVENT_STREAM)).state
    await heard.unsubscribe()
    print(
        f"{sum(sent)} aimed requests ({dict(zip(flooders, sent, strict=True))}), {landed[0]}"
        f" answers heard in the readers' account; records {before.last_seq} -> {after.last_seq}"
    )
    assert sum(sent) > 10_000, sent
    assert landed[0] > 0  # the flood reached JetStream, and its answers went elsewhere
    assert (after.messages, after.last_seq) == (before.messages, before.last_seq), (
        f"{after.last_seq - before.last_seq} records appended by {sum(sent)} aimed requests"
    )
    assert await manager.head() == seq


async def test_refused_publishes_cannot_fill_the_disk_with_the_servers_log(
    stack: Any, flooders: dict[str, Conn]
) -> None:
    """nats-server logs a line per publish a permission refuses; nats.conf rotates its log at
    10 MB and keeps three old files, so a reader's flood of refused publishes is bounded on disk
    (40 MB) however long it goes on."""
    user = flooders["user flooder"]
    subject = f"$JS.API.STREAM.INFO.{'y' * 200}"  # a long subject: ~400 bytes a logged line
    logs = stack.data_dir / "nats-server.log"
    seen: set[Path] = set()  # every rotated file, also those deleted since
    until = time.monotonic() + 60
    while len(seen) < 4 and time.monotonic() < until:  # one rotated file more than it keeps
        for _ in range(FLUSH_EVERY):
            await user.nc.publish(subject, b"x")
        await user.nc.flush(timeout=30)
        seen.update(stack.data_dir.glob("nats-server.log.*"))
    files = [logs, *stack.data_dir.glob("nats-server.log.*")]
    sizes = [f.stat().st_size for f in files]
    assert len(seen) >= 4, (len(user.errors), seen)
    assert len(files) <= 4, files
    assert sum(sizes) <= 4 * (10 * 1024 * 1024 + 4096), sizes
