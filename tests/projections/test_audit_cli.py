"""`hoist replay`, `hoist verify`, `hoist query`, `hoist sql` against a real stack: a
nats-server and, in a background thread, the runner with the query handlers (the manager's
part)."""

from __future__ import annotations

import argparse
import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from domain import subjects
from eventstore.repository import Repository
from eventstore.store import EventStore
from projections import ALL
from projections.runner import Runner
from projections.verify import snapshot
from services.cli import audit as audit_cli
from services.cli import main as cli
from services.manager.queries import serve_queries
from services.stack.natsserver import NatsServer
from tests.projections.conftest import scripted_history
from transport.client import connect


def hoist(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hoist")
    parser.add_argument("--data-dir", default="unused")
    audit_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return cli.run(args.func, args)


@pytest.fixture
def manager(nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runner]:
    """Events appended, then the runner and query handlers serving from a background loop."""
    monkeypatch.setenv("HOIST_NATS_URL", nats_server.url)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Runner] = {}
    stop = asyncio.Event()

    async def serve() -> None:
        nc = await connect(nats_server.url)
        store = EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
        await store.ensure_stream()
        holder["last"] = await scripted_history(Repository(store), sessions=6)  # type: ignore[assignment]
        runner = holder["runner"] = Runner(duckdb.connect(), store, ALL)
        await serve_queries(nc, runner)
        task = asyncio.create_task(runner.run(follow=True))
        await runner.wait_for(holder["last"], 10)  # type: ignore[arg-type]
        ready.set()
        await stop.wait()
        task.cancel()
        await nc.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    yield holder["runner"]
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)
    loop.close()


def test_replay_verify_query_sql(
    manager: Runner, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seq = manager.seq
    db = tmp_path / "audit.duckdb"
    assert hoist("replay", "--until", str(seq - 5), "--db", str(db)) == 0
    assert f"as of stream sequence {seq - 5}" in capsys.readouterr().out
    replayed = duckdb.connect(str(db))
    assert snapshot(replayed)[0] == seq - 5
    assert replayed.execute("SELECT count(*) FROM kernels").fetchall()[0][0] > 0
    assert hoist("replay", "--until", str(seq), "--db", str(db)) == 1  # never overwrites
    assert "exists" in capsys.readouterr().err
    assert hoist("replay", "--until", "yesterday", "--db", str(tmp_path / "x.duckdb")) == 1
    assert "--until" in capsys.readouterr().err

    assert hoist("verify") == 0
    assert "match" in capsys.readouterr().out
    manager.con.cursor().execute("UPDATE sessions SET owner = 'mallory'")
    assert hoist("verify") == 1
    captured = capsys.readouterr()
    assert "sessions:" in captured.out and "mallory" in captured.out and "differ" in captured.err

    assert hoist("query", "agents", "alive=true") == 0
    out = capsys.readouterr().out
    assert '"agent_id": "agent-1"' in out and f"at stream sequence {seq}" in out
    assert hoist("query", "kernels", "status=BOGUS") == 1
    assert "status" in capsys.readouterr().err
    assert hoist("sql", "SELECT count(*) AS n FROM kernels") == 0
    assert capsys.readouterr().out.startswith("n\n")
    assert hoist("sql", "DELETE FROM kernels") == 1
    assert "read-only" in capsys.readouterr().err
