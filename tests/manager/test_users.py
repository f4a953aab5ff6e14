"""Hoist users on a real nats-server: ``hoist.admin.user.add/disable/list`` record events on
``hoist.events.user.<name>``, folded again after a restart; and ``hoist user`` (the CLI)."""

from __future__ import annotations

import argparse

import pytest

from client.connection import CliError
from domain.codec import TYPE_HEADER
from domain.subjects import EVENTS, USER_ADD, USER_DISABLE, USER_LIST
from eventstore.store import EventStore
from services.cli import users as user_cli
from services.stack.natsserver import NatsServer
from tests.manager.harness import manager, request
from transport.client import Client


async def _events(nc: Client, store: EventStore, name: str) -> list[str]:
    js = nc.jetstream()
    names = []
    seq = 0
    while True:
        try:
            msg = await js.get_msg("HOIST", seq=seq + 1, subject=f"{EVENTS}.user.{name}", next=True)
        except Exception:
            return names
        names.append((msg.headers or {})[TYPE_HEADER])
        seq = msg.seq


async def test_users_are_events(nc: Client, store: EventStore) -> None:
    async with manager(nc):
        added = await request(nc, USER_ADD, {"name": "alice"})
        assert added == {
            "user": {"name": "alice", "admin": False, "enabled": True, "by": "admin"},
            "recorded": True,
            "before": None,  # a new user
        }
        again = await request(nc, USER_ADD, {"name": "alice"})
        assert again["recorded"] is False and again["before"] == added["user"]
        await request(nc, USER_ADD, {"name": "bob", "admin": True})
        disabled = await request(nc, USER_DISABLE, {"name": "alice"})
        assert disabled["user"]["enabled"] is False
        twice = await request(nc, USER_DISABLE, {"name": "alice"})
        assert twice["error"]["code"] == "conflict", twice
        unknown = await request(nc, USER_DISABLE, {"name": "carol"})
        assert unknown["error"]["code"] == "not-found", unknown
        reserved = await request(nc, USER_ADD, {"name": "admin"})
        assert reserved["error"]["code"] == "invalid-request", reserved
        assert "name" in reserved["error"]["message"]
        role = await request(nc, USER_DISABLE, {"name": "admin"})  # a role, not "no user"
        assert role["error"]["code"] == "invalid-request", role
        assert "is a role's NATS user" in role["error"]["message"], role
        bad = await request(nc, USER_ADD, {"name": "a.b"})
        assert bad["error"]["code"] == "invalid-request", bad
    async with manager(nc):  # folded again from the log
        listed = await request(nc, USER_LIST, {})
        assert listed["users"] == [
            {"name": "alice", "admin": False, "enabled": False, "by": "admin"},
            {"name": "bob", "admin": True, "enabled": True, "by": "admin"},
        ]
        enabled = await request(nc, USER_ADD, {"name": "alice"})
        assert (enabled["recorded"], enabled["user"]["enabled"]) == (True, True)
        assert enabled["before"]["enabled"] is False  # what the CLI says "enabled again" of
    assert await _events(nc, store, "alice") == ["UserAdded", "UserDisabled", "UserAdded"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hoist")
    parser.add_argument("--data-dir", default=".hoist")
    user_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


async def _run(*argv: str) -> None:
    args = _parser().parse_args(argv)
    await args.func(args)


async def test_user_cli(
    nc: Client,
    nats_server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOIST_NATS_URL", nats_server.url)
    async with manager(nc):
        await _run("user", "list")
        assert capsys.readouterr().out.strip() == "no user: add one with `hoist user add NAME`"
        await _run("user", "add", "alice")
        assert capsys.readouterr().out.splitlines() == [
            "user added: alice: user, enabled (by admin)",
            "NATS user: unchanged (no stack of this NATS server runs in .hoist): run this on the"
            " stack's host with its --data-dir",
        ]
        await _run("user", "add", "bob", "--admin")
        await _run("user", "disable", "alice")
        capsys.readouterr()
        # What an add did to a user already there: said as such, not "added".
        await _run("user", "add", "bob", "--admin")
        assert capsys.readouterr().out.startswith("user unchanged: bob: admin, enabled")
        await _run("user", "add", "bob", "--no-admin")
        assert capsys.readouterr().out.startswith("user changed: bob: user, enabled")
        await _run("user", "add", "bob", "--admin")
        assert capsys.readouterr().out.startswith("user changed: bob: admin, enabled")
        await _run("user", "add", "alice")
        assert capsys.readouterr().out.startswith("user enabled again: alice: user, enabled")
        await _run("user", "disable", "alice")
        await _run("user", "add", "alice", "--admin")
        out = capsys.readouterr().out.splitlines()[2]  # after the disable's two lines
        assert out == "user enabled again, admin flag changed: alice: admin, enabled (by admin)"
        await _run("user", "add", "alice", "--no-admin")
        await _run("user", "disable", "alice")
        capsys.readouterr()
        await _run("user", "list")
        assert capsys.readouterr().out.splitlines() == [
            "alice: user, disabled (by admin)",
            "bob: admin, enabled (by admin)",
        ]
        with pytest.raises(CliError, match="not-found"):
            await _run("user", "disable", "carol")
