"""Hoist users on a running `hoist up` stack, through the CLI only: `hoist user add` records the
user and gives them a NATS user (nats-server reloads: nothing restarts), `hoist --user NAME`
acts on their own subjects and sees their own sessions only, `hoist user disable` takes the
NATS user away."""

from __future__ import annotations

import asyncio
import getpass
import json
from typing import Any

import nats

from domain.errors import unknown_session
from tests.cli.stack_harness import Stack


async def _plain_query(url: str, subject: str, inbox: str) -> Any:
    nc = await nats.connect(url, inbox_prefix=inbox)
    try:
        return json.loads((await nc.request(subject, b"{}", timeout=10)).data)
    finally:
        await nc.close()


def test_users_added_act_on_their_own_sessions_and_disabled_ones_cannot_connect(
    hoist_stack: Stack,
) -> None:
    nats_pid = json.loads((hoist_stack.data_dir / "stack.json").read_text()).get("nats_pid")
    for name in ("ann", "ben"):
        added = hoist_stack.hoist("user", "add", name)
        assert added.returncode == 0, added.stderr
        assert f"user added: {name}: user, enabled (by admin)" in added.stdout
        assert "NATS user: written, nats-server reloaded" in added.stdout
    again = hoist_stack.hoist("user", "add", "ben")  # nothing to record; its NATS user again
    assert "user unchanged: ben" in again.stdout, again.stdout + again.stderr
    dash = hoist_stack.hoist("user", "add", "--", "-x")
    assert dash.returncode == 1 and "must not start with '-'" in dash.stderr, dash.stderr
    url = hoist_stack.hoist("creds", "user", "ann")
    assert url.returncode == 0 and url.stdout.startswith("nats://ann:"), url.stderr
    assert 'inbox_prefix="_INBOX.ann"' in url.stderr  # stdout stays the URL alone
    assert len(url.stdout.splitlines()) == 1
    image = hoist_stack.next_image()
    run = hoist_stack.hoist("--user", "ann", "run", image, "-d", "--max-wait", "30", "--", "true")
    assert run.returncode == 0, run.stdout + run.stderr
    sid = run.stdout.split()[1]
    hoist_stack.in_read_model(sid)  # the queries below read it: no earlier than its last event
    mine = hoist_stack.hoist("--user", "ann", "sessions", "--json")
    assert mine.returncode == 0, mine.stderr
    rows = json.loads(mine.stdout)["rows"]
    assert {r["owner"] for r in rows} == {"ann"} and sid in {r["session_id"] for r in rows}
    # Stock nats-py with the URL `hoist creds` printed, as the README shows: ann's own rows.
    plain = asyncio.run(_plain_query(url.stdout.strip(), "hoist.query.ann.sessions", "_INBOX.ann"))
    assert [r["session_id"] for r in plain["rows"]] == [r["session_id"] for r in rows], plain
    theirs = hoist_stack.hoist("--user", "ben", "sessions", "--json")
    assert theirs.returncode == 0, theirs.stderr
    assert json.loads(theirs.stdout)["rows"] == []
    peek = hoist_stack.hoist("--user", "ben", "destroy", sid)
    # Another user's session reads as one that never was: the one unknown-session wording.
    assert peek.returncode == 1, peek.stdout + peek.stderr
    assert peek.stderr == f"hoist: {unknown_session(sid)}\n", peek.stderr
    # A short id resolves among the caller's own sessions only.
    short = hoist_stack.hoist("--user", "ben", "destroy", sid[:12])
    assert short.stderr == f"hoist: {unknown_session(sid[:12])}\n", short.stdout + short.stderr
    own = hoist_stack.hoist("--user", "ann", "history", sid[:12])
    assert own.returncode == 0 and f"session:{sid}" in own.stdout, own.stdout + own.stderr
    # The log is not theirs to read: the manager serves each user their own sessions' events.
    history = hoist_stack.hoist("--user", "ann", "history", sid)
    assert history.returncode == 0, history.stderr
    assert "SessionEnqueued  by ann" in history.stdout, history.stdout
    watched = hoist_stack.hoist("--user", "ann", "watch", sid)
    assert "TERMINATED" in watched.stdout + watched.stderr, watched.stdout + watched.stderr
    for argv in (("history", sid), ("events", "--session", sid)):
        hidden = hoist_stack.hoist("--user", "ben", *argv)
        assert hidden.returncode == 1 and "unknown session" in hidden.stderr, argv
    whole = hoist_stack.hoist("--user", "ann", "events")
    assert whole.returncode == 1 and "hoist history SESSION" in whole.stderr, whole.stderr
    # An admin user: sees every owner's sessions, and what they do is recorded as theirs.
    assert hoist_stack.hoist("user", "add", "root", "--admin").returncode == 0
    every = hoist_stack.hoist("--user", "root", "sessions", "--json")
    assert sid in {r["session_id"] for r in json.loads(every.stdout)["rows"]}, every.stderr
    by_root = hoist_stack.hoist("--user", "root", "user", "add", "cy")
    assert "user added: cy: user, enabled (by root)" in by_root.stdout, by_root.stderr
    # Anyone sees their own quota (and only theirs).
    mine = hoist_stack.hoist("--user", "ann", "quota", "mine")
    assert mine.returncode == 0 and mine.stdout.startswith("ann: policy "), mine.stderr
    theirs = hoist_stack.hoist("--user", "ann", "quota", "mine", "--owner", "ben")
    assert theirs.returncode == 1 and "--owner: 'ben' is not 'ann'" in theirs.stderr, theirs.stderr
    # A typed --owner is sent as typed, also when it is the login name (the default is not).
    login = getpass.getuser()
    typed = hoist_stack.hoist("--user", "ann", "run", image, "-d", "--owner", login, "--", "true")
    assert typed.returncode == 1, typed.stdout + typed.stderr
    assert f"--owner: '{login}' is not 'ann'" in typed.stderr, typed.stderr
    # --user holds for admin commands too: a plain user is no admin (a trial was, once).
    raised = hoist_stack.hoist("--user", "ben", "quota", "set", "ben", "--cpu", "100")
    assert raised.returncode == 1 and "permission" in raised.stderr, raised.stdout + raised.stderr
    nan = hoist_stack.hoist("quota", "set", "ben", "--cpu", "nan")
    assert nan.returncode == 2 and "finite" in nan.stderr, nan.stdout + nan.stderr

    disabled = hoist_stack.hoist("user", "disable", "ann")
    assert disabled.returncode == 0, disabled.stderr
    assert "NATS user: removed, nats-server reloaded" in disabled.stdout
    refused = hoist_stack.hoist("--user", "ann", "sessions")
    assert refused.returncode == 1, refused.stdout
    listed = hoist_stack.hoist("user", "list")
    assert listed.stdout.splitlines() == [
        "ann: user, disabled (by admin)",
        "ben: user, enabled (by admin)",
        "cy: user, enabled (by root)",
        "root: admin, enabled (by admin)",
    ]
    if nats_pid:  # the same nats-server throughout: users came and went by reloads
        after = json.loads((hoist_stack.data_dir / "stack.json").read_text()).get("nats_pid")
        assert after == nats_pid
