"""`hoist image ...` and `hoist sync-agents` (services.image_cli) against a real manager and
dummy agents, reached through HOIST_NATS_URL as the CLI would."""

from __future__ import annotations

import argparse

import pytest

from eventstore.store import EventStore
from services.cli import images as image_cli
from services.cli import main as cli
from services.stack.natsserver import NatsServer
from tests.fleet.fleet_harness import fleet
from tests.manager.harness import GB, manager
from transport.client import Client


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hoist")
    parser.add_argument("--data-dir", default=".hoist")
    image_cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


async def _run(*argv: str) -> int | None:
    args = _parser().parse_args(argv)
    return await args.func(args)  # type: ignore[no-any-return]


async def test_image_commands(
    nc: Client,
    store: EventStore,
    nats_server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOIST_NATS_URL", nats_server.url)
    async with (
        fleet(nc, store, {"c1": 2 * GB, "c2": 4 * GB}, default_size=300 * 1024**2),
        manager(nc),
    ):
        assert await _run("image", "preload", "py:3", "--all", "--parallelism", "1") == 0
        out = capsys.readouterr().out
        assert "2/2 agents done, 0 failed" in out and "c1" in out and "c2" in out

        await _run("image", "policy", "set", "p", "--images", "a:1,b:2", "--dry-run")
        out = capsys.readouterr().out
        assert "dry run: nothing recorded, nothing pulled" in out
        # 80 % of 2 GiB, less the 300 MiB of py:3 that the preload pinned.
        assert "c1               budget 1.31 GiB, wants 0 image(s)" in out
        assert "  - a:1: size unknown" in out  # no agent has held it: no size to budget

        await _run("image", "unload", "py:3", "--agent", "c1")
        assert capsys.readouterr().out.split() == ["c1", "py:3", "removed"]

        await _run("sync-agents", "c2")
        out = capsys.readouterr().out
        assert out.startswith("c2               0 running;")

        with pytest.raises(cli.CliError, match="no preload job 'nope'"):
            await _run("image", "job", "nope")
        with pytest.raises(cli.CliError, match="--newest-tags 'torch' is not REPO=N"):
            await _run("image", "policy", "set", "p", "--newest-tags", "torch")
