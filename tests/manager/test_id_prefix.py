"""Short ids (services.cli.ids) against a real manager: a unique prefix resolves to the whole
id, an ambiguous one is refused listing the candidates, none found is the one unknown-session
wording, and a Hoist user's prefix resolves only among their own sessions (their subject)."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict
from typing import Any

import pytest

from client.connection import CliError, Connection
from domain.errors import unknown_session
from eventstore.store import EventStore
from services.cli import history as history_cli
from services.cli import ids
from services.cli import kernels as kernel_cli
from services.cli.connected import connected
from services.stack.natsserver import NatsServer
from tests.manager.harness import agents, manager, request, run_cli, until
from tests.manager.test_user_subjects import add_users, api, batch
from transport.client import Client


async def _session(nc: Client, user: str) -> str:
    created = await request(nc, api(user, "session.create"), batch())
    assert "error" not in created, created
    return str(created["session_id"])


def _user_url(nats_server: NatsServer, user: str) -> str:
    return f"nats://{user}:pw@{nats_server.url.split('//', 1)[1]}"  # no auth on this server


async def test_prefixes_resolve_among_the_callers_sessions(
    nc: Client,
    store: EventStore,
    nats_server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with agents(nc, store, ["a1"], cpu=64), manager(nc):
        await add_users(nc, "alice", "bob")
        # 17 sessions: two of them start with the same hex digit (16 digits).
        mine = [await _session(nc, "alice") for _ in range(17)]
        bobs = await _session(nc, "bob")
        await _in_read_model(nc, 18)
        by_first: dict[str, list[str]] = defaultdict(list)
        for sid in mine:
            by_first[sid[0]].append(sid)
        shared, twins = next((k, v) for k, v in by_first.items() if len(v) > 1)

        alice = await Connection.open(_user_url(nats_server, "alice"))
        try:
            assert await ids.session_id(alice, mine[0][:12]) == mine[0]
            with pytest.raises(CliError) as ambiguous:
                await ids.session_id(alice, shared)
            message = str(ambiguous.value)
            assert f"session id {shared} is ambiguous" in message, message
            assert all(sid in message for sid in twins), message
            with pytest.raises(CliError) as unknown:
                await ids.session_id(alice, "zz")
            assert str(unknown.value) == unknown_session("zz")
            # Bob's session is not alice's to see: the same refusal as one never made.
            with pytest.raises(CliError) as hidden:
                await ids.session_id(alice, bobs[:12])
            assert str(hidden.value) == unknown_session(bobs[:12])
            # A whole id goes through without a query (the request it is sent with decides).
            assert await ids.session_id(alice, bobs) == bobs
        finally:
            await alice.close()

        # The client role sees every session: bob's prefix resolves there.
        monkeypatch.setenv("HOIST_NATS_URL", nats_server.url)
        async with connected(_args()) as client:
            assert await ids.session_id(client, bobs[:12]) == bobs
            kernel = (await request(nc, "hoist.query.kernels", {"session_id": bobs}))["rows"][0]
            assert await ids.kernel_id(client, kernel["kernel_id"][:8]) == kernel["kernel_id"]

        # Commands take prefixes: history and logs, as alice.
        monkeypatch.setenv("HOIST_NATS_URL", _user_url(nats_server, "alice"))
        capsys.readouterr()
        await run_cli(history_cli.register, "history", mine[1][:10])
        assert f"session:{mine[1]}  SessionEnqueued" in capsys.readouterr().out
        await until(nc, mine[1], lambda s: s["status"] == "TERMINATED")
        await run_cli(_kernel_commands, "logs", mine[1][:10])
        assert capsys.readouterr().out == "hi\n"
        with pytest.raises(CliError, match=f"^{unknown_session(bobs[:10])}$"):
            await run_cli(history_cli.register, "history", bobs[:10])


def _kernel_commands(sub: Any) -> None:
    kernel_cli.register(sub, connected, "alice")


def _args() -> argparse.Namespace:
    return argparse.Namespace(data_dir=".hoist", user=None)


async def _in_read_model(nc: Client, sessions: int) -> None:
    """Until the sessions query lists ``sessions`` (prefixes resolve through it)."""
    deadline = time.monotonic() + 10
    while len((await request(nc, "hoist.query.sessions", {}))["rows"]) < sessions:
        assert time.monotonic() < deadline, "the read model never caught up"
        await asyncio.sleep(0.05)
