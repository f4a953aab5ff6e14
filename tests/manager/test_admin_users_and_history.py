"""Admin users act on their own subjects and are recorded as themselves; a plain user reads the
events of their own sessions through the manager (``hoist.query.<user>.history``), never
another user's."""

from __future__ import annotations

import asyncio
import json

from domain import codec
from domain.errors import unknown_session
from domain.subjects import (
    QUOTA_SET,
    USER,
    USER_ADD,
    USER_DISABLE,
    aggregate_subject,
    session_events,
)
from eventstore.store import EventStore
from tests.manager.harness import agents as running_agents
from tests.manager.harness import manager, request, until
from tests.manager.test_user_subjects import add_users, api, batch
from transport.client import Client


def history(user: str) -> str:
    return f"hoist.query.{user}.history"


async def test_an_admin_user_sees_and_ends_every_session_recorded_as_themselves(
    nc: Client, store: EventStore
) -> None:
    async with running_agents(nc, store, ["a1"]), manager(nc):
        await add_users(nc, "alice")
        root = await request(nc, USER_ADD, {"name": "root", "admin": True})
        assert "error" not in root, root
        interactive = batch(command=["sleep", "60"], session_type="interactive")
        sid = (await request(nc, api("alice", "session.create"), interactive))["session_id"]
        first, *_ = await store.read_subject(session_events(sid))
        assert first.headers[codec.ACTOR_HEADER] == "alice"  # SessionEnqueued: who asked

        # Admin commands on the admin user's own subject, recorded as theirs.
        added = await request(nc, "hoist.admin.root.user.add", {"name": "bob"}, user="root")
        assert added["user"]["by"] == "root", added
        rec = await store.last(aggregate_subject(USER, "bob"))
        assert rec is not None and rec.headers[codec.ACTOR_HEADER] == "root"
        # ... and a plain user's such subject is refused, whatever NATS let through.
        refused = await request(nc, "hoist.admin.alice.user.add", {"name": "eve"}, user="alice")
        assert refused["error"]["code"] == "forbidden", refused
        assert await store.last(aggregate_subject(USER, "eve")) is None

        # An admin command's owner filter is not forced to the admin's own either.
        await request(nc, QUOTA_SET, {"name": "alice", "max_cpu": 4})
        shown = await request(nc, "hoist.admin.root.quota.show", {}, user="root")
        assert "alice" in {row["owner"] for row in shown["owners"]}, shown
        # Enabling an admin again keeps them admin unless told otherwise.
        await request(nc, "hoist.admin.root.user.disable", {"name": "bob"}, user="root")
        bob = await request(nc, USER_ADD, {"name": "bob", "admin": True})
        assert bob["user"]["admin"], bob
        await request(nc, USER_DISABLE, {"name": "bob"})
        bob = await request(nc, USER_ADD, {"name": "bob"})
        assert bob["user"] == {"name": "bob", "admin": True, "enabled": True, "by": "admin"}

        # Every owner's rows and sessions: queries are not forced to the admin's own.
        rows = await request(nc, "hoist.query.root.sessions", {"min_seq": first.seq, "timeout": 10})
        assert [r["owner"] for r in rows["rows"]] == ["alice"], rows
        seen = await request(nc, api("root", "session.get"), {"session_id": sid})
        assert seen["owner"] == "alice", seen
        ended = await request(nc, api("root", "session.destroy"), {"session_id": sid})
        assert "error" not in ended, ended
        await until(nc, sid, lambda s: s["status"] == "TERMINATED", what="destroyed")
        events = await store.read_subject(session_events(sid))
        terminating = [r for r in events if b'"KernelTerminating"' in r.data]
        assert terminating and terminating[0].headers[codec.ACTOR_HEADER] == "root"


async def test_a_user_reads_the_history_of_their_own_sessions_only(
    nc: Client, store: EventStore
) -> None:
    async with running_agents(nc, store, ["a1"]), manager(nc):
        await add_users(nc, "alice", "bob")
        sid = (await request(nc, api("alice", "session.create"), batch()))["session_id"]
        page = await request(nc, history("alice"), {"session_id": sid})
        assert "error" not in page, page
        assert page["events"][0]["seq"] == (await store.read_subject(session_events(sid)))[0].seq
        assert page["last_seq"] >= page["events"][-1]["seq"]
        assert json.loads(page["events"][0]["data"])["owner"] == "alice"

        # Bob: the same answer as for a session that does not exist.
        for session_id in (sid, "f" * 32):
            theirs = await request(nc, history("bob"), {"session_id": session_id})
            assert theirs["error"]["code"] == "not-found", theirs
            assert theirs["error"]["message"] == f"session_id: {unknown_session(session_id)}"
        bad = await request(nc, history("alice"), {"session_id": sid, "wait_s": 99})
        assert bad["error"]["code"] == "invalid-request" and "wait_s" in bad["error"]["message"]

        # Following: a request past the last event waits for the next one.
        await until(nc, sid, lambda s: s["status"] == "TERMINATED", what="ended")
        head = (await request(nc, history("alice"), {"session_id": sid}))["last_seq"]
        # wait_s: past the 0.5 s and the ninth request's 2 s below, with 2.5 s to spare for a
        # loaded host (3.5 s left 1 s).
        follow = {"session_id": sid, "after_seq": head, "wait_s": 5.0}
        waiting = [asyncio.ensure_future(request(nc, history("alice"), follow)) for _ in range(8)]
        await asyncio.sleep(0.5)
        assert not any(w.done() for w in waiting)
        # One user's ninth waiting request is answered at once: each waits by polling the log.
        ninth = await asyncio.wait_for(request(nc, history("alice"), follow), 2)
        assert ninth["events"] == [] and not any(w.done() for w in waiting)
        for w in waiting:  # answered, empty, when wait_s passes
            assert (await w)["events"] == []


async def test_a_user_sees_their_own_quota_and_nobody_elses(nc: Client, store: EventStore) -> None:
    async with manager(nc):
        await add_users(nc, "alice", "bob")
        await request(nc, QUOTA_SET, {"name": "alice", "max_cpu": 4})
        await request(nc, QUOTA_SET, {"name": "bob", "max_cpu": 64})
        mine = await request(nc, api("alice", "quota.mine"), {})
        assert mine["owner"] == "alice" and mine["quota"]["max_cpu"] == 4, mine
        assert "policies" not in mine  # not the list of every user's policy
        theirs = await request(nc, api("alice", "quota.mine"), {"owner": "bob"})
        assert theirs["error"]["code"] == "forbidden", theirs
        # The admin subject stays the admin's.
        assert (await request(nc, "hoist.admin.alice.quota.show", {}, user="alice"))["error"][
            "code"
        ] == "forbidden"
