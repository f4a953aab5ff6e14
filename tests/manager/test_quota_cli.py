"""`hoist quota show|set|rm` (services.cli.quotas) against a real manager, reached through
HOIST_NATS_URL as the CLI would."""

from __future__ import annotations

import pytest

from client.connection import CliError
from eventstore.store import EventStore
from services.cli import quotas as quota_cli
from services.stack.natsserver import NatsServer
from tests.manager.harness import agents, create, manager, run_cli, until
from transport.client import Client


async def _run(*argv: str) -> None:
    await run_cli(quota_cli.register, *argv)


async def test_quota_commands(
    nc: Client,
    store: EventStore,
    nats_server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOIST_NATS_URL", nats_server.url)
    async with agents(nc, store, ["a1"], cpu=8), manager(nc):
        await _run("quota", "set", "alice", "--cpu", "4", "--mem", "8g", "--slot", "gpu=1",
                   "--sessions", "3", "--kernels", "4", "--lifetime", "3600",
                   "--idle", "600")  # fmt: skip
        assert capsys.readouterr().out.strip() == (
            "quota alice recorded: cpu 4, mem 8G, gpu 1, sessions 3, kernels/session 4,"
            " lifetime 3600s, idle 600s"
        )
        await _run("quota", "set", "default", "--sessions", "1")
        running = await create(nc)
        await until(nc, running["session_id"], lambda s: s["status"] == "RUNNING")
        capsys.readouterr()
        await _run("quota", "show", "alice")
        out = capsys.readouterr().out
        assert "  default: sessions 1" in out
        assert (
            "alice: policy alice (cpu 4, mem 8G, gpu 1, sessions 3, kernels/session 4,"
            " lifetime 3600s, idle 600s); using cpu 1, mem 256M, sessions 1; 0 pending"
        ) in out
        await _run("policy", "show", "alice")  # the issue's (and seed 004's) name for it
        assert capsys.readouterr().out == out
        await _run("quota", "rm", "alice")
        assert capsys.readouterr().out.strip() == "quota alice removed"
        await _run("quota", "show", "alice")
        out = capsys.readouterr().out
        assert "  alice (removed): " in out and "alice: policy default (sessions 1)" in out
        with pytest.raises(CliError):
            await _run("quota", "set", "bob", "--slot", "gpu")
