"""Admin SQL is read-only in every sense (issue 11): no files, network, extensions, writes or
settings; one statement; a row cap and a time limit.  Against the manager's own wiring:
``ReadModels`` on a DuckDB file, its runner writing while the attacks are tried."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from domain.session import Session
from domain.subjects import SQL_SUBJECT
from eventstore.repository import Repository
from eventstore.store import EventStore
from services.manager.read_models import ReadModels
from transport.client import Client

SECRET = "s3cr3t-password-of-the-manager"


@pytest.fixture
async def models(nc: Client, store: EventStore, tmp_path: Path) -> AsyncIterator[ReadModels]:
    models = ReadModels(nc, store, tmp_path / "data" / "readmodels.duckdb")
    await models.start()
    yield models
    await models.stop()


async def sql(nc: Client, query: str, **options: Any) -> dict[str, Any]:
    request = json.dumps({"sql": query, **options}).encode()
    reply = await nc.request(SQL_SUBJECT, request, timeout=40)
    answer: dict[str, Any] = json.loads(reply.data)
    return answer


async def session_visible(nc: Client, repo: Repository) -> str:
    """Append a session and return its owner once admin SQL sees it (the runner wrote it)."""
    session = Session.enqueue(
        owner=f"o-{time.monotonic_ns()}", image="img", resources={"cpu": 1, "mem": 1},
        resource_group="rg",
    )  # fmt: skip
    [*_, seq] = await repo.save(session)
    reply = await sql(
        nc, f"SELECT owner FROM sessions WHERE session_id = '{session.id}'", min_seq=seq
    )
    assert reply["rows"] == [[session.owner]], reply
    return session.owner


async def test_no_files_network_or_extensions(
    nc: Client, repo: Repository, models: ReadModels, tmp_path: Path
) -> None:
    creds = tmp_path / "credentials.json"
    creds.write_text(json.dumps({"manager": SECRET}))
    (tmp_path / "rows.csv").write_text(f"role,password\nmanager,{SECRET}\n")
    for query in [
        f"SELECT * FROM read_text('{creds}')",
        f"SELECT content FROM read_blob('{creds}')",
        f"SELECT * FROM read_csv('{tmp_path / 'rows.csv'}')",
        f"SELECT * FROM '{tmp_path / 'rows.csv'}'",
        f"SELECT * FROM read_parquet('{creds}')",
        f"SELECT * FROM read_json('{creds}')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM read_csv('https://example.com/a.csv')",
        "SELECT * FROM sqlite_scan('/tmp/x.db', 't')",  # would autoinstall an extension
    ]:
        reply = await sql(nc, query)
        assert "error" in reply and SECRET not in json.dumps(reply), (query, reply)
        assert reply["error"]["code"] in ("read-only", "invalid-request"), (query, reply)
    # The file functions are refused as such, not by accident of a parse error.
    denied = (await sql(nc, "SELECT * FROM glob('/etc/*')"))["error"]
    assert denied["code"] == "read-only" and denied["message"].startswith("read-only: ")
    assert "file" in denied["message"]
    await session_visible(nc, repo)


async def test_every_other_statement_is_refused(
    nc: Client, repo: Repository, models: ReadModels, tmp_path: Path
) -> None:
    owner = await session_visible(nc, repo)
    out = tmp_path / "out"
    refused = {
        f"ATTACH '{out}.duckdb' AS other": "ATTACH",
        f"COPY sessions TO '{out}.csv'": "COPY",
        f"COPY (SELECT 1) TO '{out}.parquet' (FORMAT parquet)": "COPY",
        f"EXPORT DATABASE '{out}'": "EXPORT",
        "INSTALL httpfs": "LOAD",
        "LOAD httpfs": "LOAD",
        "PRAGMA enable_profiling": "PRAGMA",
        "PRAGMA memory_limit = '1MB'": "SET",  # DuckDB parses it as a SET
        "SET enable_external_access = true": "SET",
        "RESET lock_configuration": "SET",
        "CREATE TABLE t AS SELECT 1": "CREATE",
        "INSERT INTO sessions (session_id) VALUES ('forged')": "INSERT",
        "UPDATE sessions SET owner = 'mallory'": "UPDATE",
        "DELETE FROM sessions": "DELETE",
        "CHECKPOINT": "CALL",
        "SELECT 1; SELECT 2": "2 statements",
        "SELECT 1; DROP TABLE sessions": "2 statements",
    }
    for query, named in refused.items():
        error = (await sql(nc, query))["error"]
        assert error["code"] == "read-only", (query, error)
        assert error["message"].startswith("read-only: ") and named in error["message"]
    written = await asyncio.to_thread(lambda: list(tmp_path.glob("out*")))
    assert not written  # nothing written outside
    # The lock holds even for a statement that got past the check: the runner's own cursors
    # cannot turn access back on either.
    assert models.runner is not None
    with pytest.raises(duckdb.Error, match="locked"):
        models.runner.con.cursor().execute("SET enable_external_access = true")
    settings = await sql(
        nc,
        "SELECT name, value FROM duckdb_settings() WHERE name IN ('enable_external_access',"
        " 'lock_configuration', 'autoinstall_known_extensions') ORDER BY name",
    )
    assert settings["rows"] == [
        ["autoinstall_known_extensions", "false"],
        ["enable_external_access", "false"],
        ["lock_configuration", "true"],
    ]
    # Nothing changed, and the runner still writes (through Arrow) after all of it.
    left = await sql(nc, "SELECT owner, count(*) FROM sessions GROUP BY owner")
    assert left["rows"] == [[owner, 1]]
    await session_visible(nc, repo)


async def test_one_duckdb_thread_unless_told(nc: Client, models: ReadModels) -> None:
    """DuckDB would take every core at each commit, from the manager and nats-server."""
    reply = await sql(nc, "SELECT current_setting('threads')")
    assert reply["rows"] == [[1]], reply


async def test_time_limit_and_row_cap(nc: Client, repo: Repository, models: ReadModels) -> None:
    started = time.monotonic()
    slow = await sql(
        nc, "SELECT count(*) FROM range(1000000000) a, range(1000000000) b", time_limit=0.5
    )
    took = time.monotonic() - started
    assert slow["error"]["code"] == "timeout", slow
    assert "time_limit of 0.5s" in slow["error"]["message"] and took < 10, took
    # Interrupted while the rows are fetched, too (a streamed result: none ever matches).
    streamed = await sql(
        nc, "SELECT a.range FROM range(100000000) a, range(100) b WHERE a.range + b.range < 0",
        time_limit=0.3,
    )  # fmt: skip
    assert streamed["error"]["code"] == "timeout", streamed

    capped = await sql(nc, "SELECT * FROM range(50)", limit=10)
    assert capped["rows"] == [[i] for i in range(10)] and capped["truncated"]
    whole = await sql(nc, "SELECT * FROM range(50)", limit=50)
    assert len(whole["rows"]) == 50 and not whole["truncated"]
    assert (await sql(nc, "SELECT * FROM range(20000)"))["truncated"]  # default cap 1000
    for options, field in [
        ({"time_limit": 0}, "time_limit"),
        ({"time_limit": 31}, "time_limit"),
        ({"time_limit": "5"}, "time_limit"),
        ({"limit": 10_001}, "limit"),
        ({"colour": 1}, "colour"),
    ]:
        error = (await sql(nc, "SELECT 1", **options))["error"]
        assert error["code"] == "invalid-request" and field in error["message"], error
    await session_visible(nc, repo)
