"""Queries over NATS: filters, read-your-writes, read-only SQL, verify."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import duckdb
import pytest

from domain.session import Session
from domain.subjects import SQL_SUBJECT, VERIFY_SUBJECT
from eventstore.repository import Repository
from eventstore.store import EventStore
from projections import ALL
from projections.runner import Runner
from services.manager.queries import serve_queries
from tests.projections.conftest import scripted_history
from transport.client import Client


@pytest.fixture
async def runner(nc: Client, store: EventStore) -> AsyncIterator[Runner]:
    runner = Runner(duckdb.connect(), store, ALL)
    task = asyncio.create_task(runner.run(follow=True))
    subs = await serve_queries(nc, runner)
    yield runner
    for sub in subs:
        await sub.unsubscribe()
    task.cancel()


async def ask(nc: Client, subject: str, request: dict[str, Any]) -> dict[str, Any]:
    reply = await nc.request(subject, json.dumps(request).encode(), timeout=10)
    answer: dict[str, Any] = json.loads(reply.data)
    return answer


async def test_read_your_writes(nc: Client, repo: Repository, runner: Runner) -> None:
    for _ in range(5):
        session = Session.enqueue(
            owner="dave", image="img", resources={"cpu": 1, "mem": 1}, resource_group="rg"
        )
        seqs = await repo.save(session)
        # Asked right after the command: the reply waits until the model has the session.
        reply = await ask(
            nc, "hoist.query.sessions", {"session_id": session.id, "min_seq": seqs[-1]}
        )
        assert reply["seq"] >= seqs[-1]
        assert [r["session_id"] for r in reply["rows"]] == [session.id]
        assert reply["rows"][0]["status"] == "PENDING"
    kernels = await ask(nc, "hoist.query.kernels", {"owner": "dave", "status": ["PENDING"]})
    assert len(kernels["rows"]) == 5 and not kernels["truncated"]
    late = await ask(nc, "hoist.query.kernels", {"min_seq": seqs[-1] + 100, "timeout": 0.2})
    assert late["error"]["code"] == "timeout" and "min_seq" in late["error"]["message"]


async def test_every_query_and_its_filters(nc: Client, repo: Repository, runner: Runner) -> None:
    last = await scripted_history(repo)
    base = {"min_seq": last}
    agents = await ask(nc, "hoist.query.agents", {**base, "alive": True})
    assert [a["agent_id"] for a in agents["rows"]] == ["agent-0", "agent-1"]
    assert {"free_cpu", "free_mem", "free_disk", "last_heartbeat_at"} <= set(agents["rows"][0])
    images = await ask(nc, "hoist.query.images", {**base, "agent_id": "agent-0"})
    assert [i["image"] for i in images["rows"]] == ["docker.io/library/img:0-0"]
    pulls = await ask(nc, "hoist.query.pulls", {**base, "outcome": ["pulled", "failed"]})
    assert pulls["rows"] and {p["outcome"] for p in pulls["rows"]} <= {"pulled", "failed"}
    by_owner = await ask(nc, "hoist.query.occupancy", base)
    by_agent = await ask(
        nc, "hoist.query.occupancy", {**base, "by": "agent", "agent_id": "agent-1"}
    )
    assert {"owner", "kernels", "cpu", "mem"} == set(by_owner["rows"][0])
    assert [r["agent_id"] for r in by_agent["rows"]] == ["agent-1"]
    preloaded = await ask(nc, "hoist.query.images", {**base, "preloaded": True})
    assert [(i["agent_id"], i["image"], i["pinned"]) for i in preloaded["rows"]] == [
        ("agent-1", "docker.io/library/base:1", True)
    ]
    assert preloaded["rows"][0]["preload_reason"] == "preload: job j1"
    unpinned = await ask(nc, "hoist.query.images", {**base, "pinned": False})
    assert {i["image"] for i in unpinned["rows"]} >= {"docker.io/library/img:0-0"}
    assert not any(i["preloaded"] for i in unpinned["rows"])
    policies = await ask(nc, "hoist.query.policies", {**base, "name": ["agent-policy", "x"]})
    [policy] = policies["rows"]
    assert policies["seq"] == last and not policies["truncated"]
    assert policy["resource_groups"] == ["default"] and policy["priority"] == 3
    assert policy["rules"] == [{"kind": "images", "images": ["docker.io/library/img:3"]}]
    assert not policy["removed"] and policy["updated_at"] > policy["created_at"]
    assert (await ask(nc, "hoist.query.policies", {**base, "removed": True}))["rows"] == []
    limited = await ask(nc, "hoist.query.kernels", {**base, "limit": 2})
    assert len(limited["rows"]) == 2 and limited["truncated"] and limited["seq"] == last

    for subject, request, field in [
        ("hoist.query.kernels", {"status": "RUNING"}, "status"),
        ("hoist.query.kernels", {"colour": "red"}, "colour"),
        ("hoist.query.agents", {"alive": "yes"}, "alive"),
        ("hoist.query.policies", {"removed": "no"}, "removed"),
        ("hoist.query.policies", {"resource_group": "rg"}, "resource_group"),
        ("hoist.query.sessions", {"owner": 3}, "owner"),
        ("hoist.query.pulls", {"limit": 0}, "limit"),
        ("hoist.query.occupancy", {"by": "image"}, "by"),
        ("hoist.query.sessions", {"min_seq": -1}, "min_seq"),
    ]:
        error = (await ask(nc, subject, request))["error"]
        assert error["code"] == "invalid-request" and field in error["message"], (request, error)
    raw = await nc.request("hoist.query.kernels", b"[1]", timeout=5)
    assert json.loads(raw.data)["error"]["code"] == "invalid-request"


async def test_sql_is_read_only(nc: Client, repo: Repository, runner: Runner) -> None:
    last = await scripted_history(repo, sessions=4)
    ok = await ask(
        nc, SQL_SUBJECT, {"sql": "SELECT owner, count(*) AS n FROM sessions GROUP BY owner",
                          "min_seq": last},
    )  # fmt: skip
    assert ok["columns"] == ["owner", "n"] and ok["rows"] and ok["seq"] == last
    before = runner.con.cursor().execute("SELECT count(*) FROM sessions").fetchall()
    for sql in [
        "INSERT INTO sessions (session_id) VALUES ('x')",
        "UPDATE sessions SET owner = 'mallory'",
        "DELETE FROM sessions",
        "DROP TABLE sessions",
        "ATTACH '/tmp/other.duckdb' AS other",
        "COPY sessions TO '/tmp/sessions.csv'",
        "CREATE TABLE t AS SELECT 1",
        "SET threads = 1",
        "SELECT 1; DROP TABLE sessions",
    ]:
        error = (await ask(nc, SQL_SUBJECT, {"sql": sql}))["error"]
        assert error["code"] == "read-only", (sql, error)
    assert runner.con.cursor().execute("SELECT count(*) FROM sessions").fetchall() == before
    bad = (await ask(nc, SQL_SUBJECT, {"sql": "SELECT nope FROM sessions"}))["error"]
    assert bad["code"] == "invalid-request" and "nope" in bad["message"]


async def test_verify_reports_differences(nc: Client, repo: Repository, runner: Runner) -> None:
    last = await scripted_history(repo, sessions=4)
    assert await runner.wait_for(last, 5)
    clean = await ask(nc, VERIFY_SUBJECT, {})
    assert clean == {"seq": last, "ok": True, "differences": [], "quarantined": 0}
    runner.con.cursor().execute("UPDATE agents SET cpu = 99 WHERE agent_id = 'agent-1'")
    dirty = await ask(nc, VERIFY_SUBJECT, {})
    assert not dirty["ok"]
    [diff] = dirty["differences"]
    assert diff["table"] == "agents" and diff["only_live"] == 1 and diff["only_rebuilt"] == 1
    assert diff["examples_live"][0]["cpu"] == 99
