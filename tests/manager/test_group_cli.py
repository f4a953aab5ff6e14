"""`hoist group list|set|rm` (services.cli.groups) against a real manager, reached through
HOIST_NATS_URL as the CLI would."""

from __future__ import annotations

import pytest

from client.connection import CliError
from eventstore.store import EventStore
from services.cli import groups as group_cli
from services.stack.natsserver import NatsServer
from tests.manager.harness import agents, manager, run_cli
from transport.client import Client


async def _run(*argv: str) -> None:
    await run_cli(group_cli.register, *argv)


async def test_group_commands(
    nc: Client,
    store: EventStore,
    nats_server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOIST_NATS_URL", nats_server.url)
    async with agents(nc, store, ["g1"], resource_group="gpu", cpu=8), manager(nc):
        await _run("group", "list")
        assert capsys.readouterr().out.strip() == (
            "gpu: everyone (not defined); agents: 1 live (g1): cpu 8, mem 8G"
        )
        await _run("group", "set", "gpu", "--user", "bob", "--user", "alice",
                   "--description", "the A100s")  # fmt: skip
        assert capsys.readouterr().out.strip() == "group gpu recorded: users alice, bob"
        await _run("group", "set", "gpu", "--user", "alice", "--user", "bob",
                   "--description", "the A100s")  # fmt: skip
        assert capsys.readouterr().out.strip() == "group gpu unchanged: users alice, bob"
        await _run("group", "set", "lab", "--public")
        await _run("group", "set", "closed")
        capsys.readouterr()
        await _run("group", "list")
        assert capsys.readouterr().out.splitlines() == [
            "closed: nobody; agents: no live agent",
            "gpu (the A100s): users alice, bob; agents: 1 live (g1): cpu 8, mem 8G",
            "lab: everyone (public); agents: no live agent",
        ]
        await _run("group", "rm", "gpu")
        assert capsys.readouterr().out.strip() == "group gpu removed: open to every user again"
        await _run("group", "list")
        out = capsys.readouterr().out
        assert "gpu (the A100s): everyone (definition removed); agents: 1 live (g1)" in out
        with pytest.raises(CliError, match="not-found"):
            await _run("group", "rm", "gpu")
        with pytest.raises(CliError, match=r"users: .*not both"):
            await _run("group", "set", "x", "--user", "a", "--public")
