"""Per-user command subjects (``hoist.api.<user>.<x>.<y>``, services.manager.server) on a real
nats-server: the owner comes from the subject, a payload naming another owner is ``forbidden``,
another user's session or stream is ``not-found`` exactly as one that does not exist.  (What
NATS users may publish there is tested against the generated permissions in tests/test_roles.py.)
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from client.connection import CliError, Connection, login_name, scoped, scoped_user
from domain.subjects import SESSION_CREATE, SESSION_GET, USER_ADD, USER_DISABLE
from eventstore.store import EventStore
from services.cli.stack_url import stack_url
from services.stack.natsserver import NatsServer
from tests.manager.harness import agents as running_agents
from tests.manager.harness import create_payload, ended, manager, read_stream, request, until
from transport.client import Client


def api(user: str, verb: str) -> str:
    return f"hoist.api.{user}.{verb}"


async def add_users(nc: Client, *names: str) -> None:
    for name in names:
        added = await request(nc, USER_ADD, {"name": name})
        assert "error" not in added, added


def batch(**overrides: Any) -> dict[str, Any]:
    payload = create_payload(session_type="batch", command=["sh", "-c", "echo hi"])
    del payload["owner"]  # the subject says whose it is
    return payload | overrides


async def test_the_owner_comes_from_the_subject(nc: Client, store: EventStore) -> None:
    async with running_agents(nc, store, ["a1"]), manager(nc) as m:
        await add_users(nc, "alice", "bob")
        mine = await request(nc, api("alice", "session.create"), batch())
        assert "error" not in mine, mine
        assert mine["owner"] == "alice"
        same = await request(nc, api("alice", "session.create"), batch(owner="alice"))
        assert "error" not in same, same
        forged = await request(nc, api("alice", "session.create"), batch(owner="bob"))
        assert forged["error"]["code"] == "forbidden", forged
        assert forged["error"]["message"].startswith("owner: 'bob' is not 'alice'")
        assert {s.owner for s in m.fleet.sessions.values()} == {"alice"}

        # An answer goes only to the user's own inboxes, never to another user's.
        stolen = await nc.subscribe("_INBOX.bob.spoof")
        await nc.publish(
            api("alice", "session.get"),
            json.dumps({"session_id": mine["session_id"]}).encode(),
            reply="_INBOX.bob.spoof",
        )
        with pytest.raises(TimeoutError):
            await stolen.next_msg(timeout=1)
        await stolen.unsubscribe()

        vols = await request(nc, api("alice", "volume.list"), {"owner": "bob"})
        assert vols["error"]["code"] == "forbidden", vols
        vols = await request(nc, api("alice", "volume.list"), {})
        assert "error" not in vols, vols

        bobs = await request(nc, api("bob", "session.create"), batch())
        bob_sid = bobs["session_id"]
        await until(nc, bob_sid, ended, what="bob's ended")
        await until(nc, mine["session_id"], ended, what="alice's ended")
        missing = await request(nc, api("alice", "session.get"), {"session_id": "f" * 32})
        assert missing["error"]["code"] == "not-found"
        for verb, extra in (
            ("session.get", {}),
            ("session.destroy", {}),
            ("session.logs", {}),
            ("session.exec", {"command": ["true"]}),
        ):
            reply = await request(nc, api("alice", verb), {"session_id": bob_sid, **extra})
            assert reply["error"]["code"] == "not-found", (verb, reply)
            assert reply["error"]["message"] == missing["error"]["message"].replace(
                "f" * 32, bob_sid
            )
        own = await request(nc, api("alice", "session.get"), {"session_id": mine["session_id"]})
        assert own["owner"] == "alice"

        # Streams: alice reads what her logs opened, never bob's.
        opened = await request(nc, api("alice", "session.logs"), {"session_id": mine["session_id"]})
        assert "error" not in opened, opened
        bob_opened = await request(nc, api("bob", "session.logs"), {"session_id": bob_sid})
        assert "error" not in bob_opened, bob_opened
        read = {"agent_id": bob_opened["agent_id"], "stream_id": bob_opened["stream_id"]}
        refused = await request(nc, api("alice", "stream.read"), read)
        assert refused["error"]["code"] == "not-found", refused
        assert refused["error"]["message"].startswith("stream_id: no stream")
        read = {"agent_id": opened["agent_id"], "stream_id": opened["stream_id"], "wait": 1}
        chunk = await request(nc, api("alice", "stream.read"), read)
        assert "error" not in chunk, chunk
        # The unscoped subjects stay (the client role's: any owner).
        data, _ = await read_stream(nc, bob_opened)
        assert data == b"hi\n"


async def test_the_cli_with_a_users_url_uses_their_subjects(
    nc: Client, store: EventStore, nats_server: NatsServer
) -> None:
    host = nats_server.url.split("//", 1)[1]
    async with manager(nc) as m:
        await add_users(nc, "alice", "bob")
        conn = await Connection.open(f"nats://alice:pw@{host}")  # no auth on this test server
        try:
            assert conn.user == "alice"
            payload = create_payload(owner=login_name(), request_id="cli")
            created = await conn.request(SESSION_CREATE, payload)
            assert created["owner"] == "alice"  # the login-name default left out: the subject's
            with pytest.raises(CliError, match=r"owner: 'bob' is not 'alice'.*\(forbidden\)"):
                await conn.request(SESSION_CREATE, create_payload(owner="bob"))
            bobs = await request(nc, api("bob", "session.create"), batch())
            with pytest.raises(CliError, match="not-found"):
                await conn.request(SESSION_GET, {"session_id": bobs["session_id"]})
        finally:
            await conn.close()
        assert m.fleet.sessions[created["session_id"]].owner == "alice"


def test_scoping_by_the_urls_user() -> None:
    assert scoped_user("nats://client:x@h:1") is None
    assert scoped_user("nats://agent-a:x@h:1") is None
    assert scoped_user("nats://h:1") is None
    assert scoped_user("nats://alice:x@h:1") == "alice"
    assert scoped("alice", "hoist.api.session.get", {"session_id": "s"}) == (
        "hoist.api.alice.session.get",
        {"session_id": "s"},
    )
    assert scoped("alice", "hoist.query.kernels", {"owner": "x"}) == (
        "hoist.query.alice.kernels",
        {"owner": "x"},
    )
    assert scoped("alice", "hoist.query.agents", {}) == ("hoist.query.alice.agents", {})
    assert scoped("alice", "hoist.api.volume.list", {"owner": "alice"})[1] == {}


def test_user_with_a_url_of_someone_else_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOIST_NATS_URL", "nats://client:x@127.0.0.1:4222")
    args = argparse.Namespace(data_dir=".hoist", user="alice")
    with pytest.raises(CliError, match="does not log in as user 'alice'"):
        stack_url(args, "client")
    with pytest.raises(CliError, match="does not log in as user 'alice'"):
        stack_url(args, "admin")  # admin commands too: --user never means the admin role
    monkeypatch.setenv("HOIST_NATS_URL", "nats://alice:x@127.0.0.1:4222")
    assert stack_url(args, "client") == "nats://alice:x@127.0.0.1:4222"
    assert stack_url(args, "admin") == "nats://alice:x@127.0.0.1:4222"


async def test_users_query_only_their_own_rows(nc: Client, store: EventStore) -> None:
    async with manager(nc):
        await add_users(nc, "alice", "bob")
        for owner in ("alice", "bob"):
            reply = await request(nc, api(owner, "session.create"), batch())
            assert "error" not in reply, reply
        seq = await store.last_seq("hoist.events.>")
        wait = {"min_seq": seq, "timeout": 15}
        for name in ("sessions", "kernels"):
            mine = await request(nc, f"hoist.query.alice.{name}", wait)
            assert {r["owner"] for r in mine["rows"]} == {"alice"}, (name, mine)
            every = await request(nc, f"hoist.query.{name}", wait)  # the client role's
            assert {r["owner"] for r in every["rows"]} == {"alice", "bob"}
            forged = await request(nc, f"hoist.query.alice.{name}", wait | {"owner": "bob"})
            assert forged["error"]["code"] == "forbidden", forged
            assert forged["error"]["message"].startswith("owner: 'bob' is not 'alice'")
        occupancy = await request(nc, "hoist.query.alice.occupancy", wait)
        assert "error" not in occupancy, occupancy
        assert all(r.get("owner") in (None, "alice") for r in occupancy["rows"]), occupancy
        # The fleet-wide queries: an admin user's only.
        fleet = await request(nc, "hoist.query.alice.agents", {})
        assert fleet["error"]["code"] == "forbidden", fleet
        assert fleet["error"]["message"].startswith("user 'alice' is no admin")
        await request(nc, USER_ADD, {"name": "alice", "admin": True})
        fleet = await request(nc, "hoist.query.alice.agents", {})
        assert "error" not in fleet, fleet


async def test_only_enabled_users_subjects_are_served(nc: Client, store: EventStore) -> None:
    """NATS permissions aside, the manager serves a per-user subject only for an enabled Hoist
    user: never added, or disabled, is ``forbidden`` and nothing is recorded."""
    async with manager(nc) as m:
        for user in ("carol", "dave"):
            refused = await request(nc, api(user, "session.create"), batch())
            assert refused["error"] == {
                "code": "forbidden",
                "message": f"user {user!r} is not an enabled Hoist user; an admin adds (or"
                " enables) them with hoist user add",
            }, refused
            if user == "carol":
                await add_users(nc, "carol")
                created = await request(nc, api("carol", "session.create"), batch())
                assert created["owner"] == "carol", created
                await request(nc, USER_DISABLE, {"name": "carol"})
        sessions = dict(m.fleet.sessions)
        seq = await store.last_seq("hoist.events.>")
        for user in ("carol", "dave"):
            for verb, payload in (
                ("session.create", batch()),
                ("session.get", {"session_id": created["session_id"]}),
                ("session.destroy", {"session_id": created["session_id"]}),
                ("volume.list", {}),
            ):
                reply = await request(nc, api(user, verb), payload)
                assert reply["error"]["code"] == "forbidden", (user, verb, reply)
            for name in ("sessions", "kernels", "occupancy"):
                reply = await request(nc, f"hoist.query.{user}.{name}", {})
                assert reply["error"]["code"] == "forbidden", (user, name, reply)
                assert "not an enabled Hoist user" in reply["error"]["message"]
        assert await store.last_seq("hoist.events.>") == seq  # nothing changed
        assert dict(m.fleet.sessions).keys() == sessions.keys()
        await add_users(nc, "carol")  # enabled again: served again, at once
        again = await request(
            nc, api("carol", "session.get"), {"session_id": created["session_id"]}
        )
        assert again["owner"] == "carol", again
