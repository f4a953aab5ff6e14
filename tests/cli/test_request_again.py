"""An idempotent request (a create with its request_id) is asked again, the same, while nothing
answers or the store is unavailable (a manager failing over, a stream electing its leader), and
`hoist run` sends one: a create whose reply was lost does not become two sessions."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from nats.aio.msg import Msg

from client import connection
from client.connection import Connection, NoReply, ReplyError
from domain.subjects import SESSION_CREATE, query_subject
from services.stack.natsserver import NatsServer
from tests.cli.stack_harness import run_hoist
from transport.client import Client


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "AGAIN_PAUSE_S", 0.05)


async def test_asked_again_the_same_until_answered(
    nats_server: NatsServer, nc: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    heard: list[dict[str, object]] = []

    async def manager(msg: Msg) -> None:
        heard.append(json.loads(msg.data))
        if len(heard) == 1:
            return  # paused: the first asking gets no reply
        if len(heard) == 2:
            await msg.respond(b'{"error": {"code": "unavailable", "message": "electing"}}')
            return
        await msg.respond(b'{"session_id": "s1"}')

    await nc.subscribe(SESSION_CREATE, cb=manager)
    await nc.flush()
    conn = await Connection.open(nats_server.url)
    try:
        payload = {"owner": "ann", "request_id": "r1"}
        reply = await conn.request(SESSION_CREATE, payload, wait_s=0.3, again_for_s=5)
    finally:
        await conn.close()
    assert reply == {"session_id": "s1"}
    assert heard == [payload] * 3  # the same request each time
    assert capsys.readouterr().err.count("asking again (the same request)") == 2


async def test_not_asked_again_without_leave_or_for_another_error(
    nats_server: NatsServer, nc: Client
) -> None:
    heard: list[bytes] = []

    async def refuses(msg: Msg) -> None:
        heard.append(msg.data)
        await msg.respond(b'{"error": {"code": "invalid-request", "message": "image: bad"}}')

    await nc.subscribe(SESSION_CREATE, cb=refuses)
    await nc.flush()
    conn = await Connection.open(nats_server.url)
    try:
        with pytest.raises(ReplyError, match="image: bad"):
            await conn.request(SESSION_CREATE, {"owner": "ann"}, wait_s=0.3, again_for_s=5)
        assert len(heard) == 1
        with pytest.raises(NoReply, match=r"nothing answers hoist\.api\.session\.get"):
            await conn.request("hoist.api.session.get", {}, wait_s=0.2)  # nobody: at once
    finally:
        await conn.close()


async def test_hoist_run_sends_a_request_id_and_asks_again_with_it(
    nats_server: NatsServer, nc: Client
) -> None:
    heard: list[dict[str, object]] = []

    async def manager(msg: Msg) -> None:
        heard.append(json.loads(msg.data))
        if len(heard) > 1:  # the first reply is lost (a manager paused past the client's wait)
            # The first try stored the session: this one found it (``created`` false).
            view = {"session_id": "s1", "status": "PENDING", "status_info": "queued"}
            view["created"] = False
            await msg.respond(json.dumps({**view, "kernels": []}).encode())

    await nc.subscribe(SESSION_CREATE, cb=manager)
    await nc.flush()
    env = {**os.environ, "HOIST_NATS_URL": nats_server.url}
    hoist = ["run", "-d", "--max-wait", "0", "img:1"]
    # Off this event loop, which meanwhile answers as the manager.
    done = await asyncio.to_thread(run_hoist, hoist, env=env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.splitlines()[:2] == [
        "found session s1 (created by an earlier try of this request)",
        "session s1 PENDING queued",
    ], done.stdout
    assert len(heard) == 2 and heard[0] == heard[1], heard
    assert isinstance(heard[0]["request_id"], str) and len(heard[0]["request_id"]) == 32


async def test_a_query_answered_unavailable_is_asked_again(
    nats_server: NatsServer,
    nc: Client,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A read-model query changes nothing: ``unavailable`` (the manager's read models
    restarting) is asked again for READ_AGAIN_FOR_S without being told to, no responders is
    not (no manager: said at once), and another query's refusal is not."""
    monkeypatch.setattr(connection, "READ_AGAIN_FOR_S", 5.0)
    heard: list[bytes] = []

    async def restarting(msg: Msg) -> None:
        heard.append(msg.data)
        if len(heard) < 3:
            await msg.respond(b'{"error": {"code": "unavailable", "message": "restarting"}}')
        else:
            await msg.respond(b'{"rows": [], "seq": 0}')

    await nc.subscribe(query_subject("kernels"), cb=restarting)
    await nc.flush()
    conn = await Connection.open(nats_server.url)
    try:
        assert await conn.request(query_subject("kernels"), {}, wait_s=0.3) == {
            "rows": [],
            "seq": 0,
        }
        assert len(heard) == 3
        # Two answers alike: said once, not at every asking.
        assert capsys.readouterr().err.count("restarting (unavailable); asking again") == 1
        with pytest.raises(NoReply, match="nothing answers"):
            await conn.request(query_subject("sessions"), {}, wait_s=0.3)  # at once
        monkeypatch.setattr(connection, "READ_AGAIN_FOR_S", 0.0)
        heard.clear()
        with pytest.raises(ReplyError, match="restarting"):
            await conn.request(query_subject("kernels"), {}, wait_s=0.3)
        assert len(heard) == 1
    finally:
        await conn.close()
