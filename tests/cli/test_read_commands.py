"""The read commands (ps, sessions, agents, images, occupancy, pulls) as tables and --json, and
destroy, against the stack with the real projection runner and query handlers beside it
(started here until the manager process serves them itself)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import duckdb
import pytest

from domain import subjects
from domain.image_ref import canonical
from projections import ALL
from projections.runner import Runner
from services.eventstore.store import EventStore
from services.manager.queries import serve_queries
from services.transport.client import connect
from tests.cli.stack_harness import HOIST, Stack


@pytest.fixture
async def read_models(hoist_stack: Stack) -> AsyncIterator[None]:
    nc = await connect(hoist_stack.creds("manager"))
    runner = Runner(
        duckdb.connect(), EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL]), ALL
    )
    task = asyncio.create_task(runner.run(follow=True))
    subs = await serve_queries(nc, runner)
    yield
    for sub in subs:
        await sub.unsubscribe()
    task.cancel()
    await nc.close()


async def hoist(stack: Stack, *args: str) -> tuple[int, str, str]:
    """`hoist` as a child while this event loop keeps serving the queries."""
    proc = await asyncio.create_subprocess_exec(
        HOIST,
        "--data-dir",
        str(stack.data_dir),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_tables_json_and_destroy(hoist_stack: Stack, read_models: None) -> None:
    image = hoist_stack.next_image()
    code, out, err = await hoist(hoist_stack, "run", image, "--cluster-size", "2", "--owner", "ann")
    assert code == 0, out + err
    session_id = out.split()[1]

    code, out, _ = await hoist(hoist_stack, "ps", "--session", session_id, "--json")
    assert code == 0
    rows = json.loads(out)["rows"]
    assert {r["status"] for r in rows} == {"RUNNING"} and len(rows) == 2
    assert {r["agent_id"] for r in rows} == {"agent-1", "agent-2"}

    code, out, _ = await hoist(hoist_stack, "ps", "--session", session_id)
    assert code == 0
    assert out.count("RUNNING") == 2 and "ann" in out and session_id[:12] in out
    assert "row(s) as of event" in out

    code, out, _ = await hoist(hoist_stack, "sessions", "--owner", "ann")
    assert code == 0 and session_id[:12] in out and "RUNNING" in out

    # No row: the header still says what a row would hold (not a blank line).
    code, out, _ = await hoist(hoist_stack, "sessions", "--owner", "nobody-at-all")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["session_id", "owner", "image"], out
    assert out.splitlines()[1].startswith("0 row(s) as of event"), out

    code, out, _ = await hoist(hoist_stack, "images", "--agent", "agent-1")
    assert code == 0 and image in out and "240.0 MiB" in out and "is known" not in out
    # An agent that is not there: said so, not just no row.
    code, out, err = await hoist(hoist_stack, "images", "--agent", "agent-9")
    assert code == 1 and "no agent 'agent-9' is known: `hoist agents` lists them" in err, err
    code, out, err = await hoist(hoist_stack, "pulls", "--agent", "agent-9", "--json")
    assert code == 1 and "no agent 'agent-9' is known" in err and not out, (out, err)

    code, out, _ = await hoist(hoist_stack, "pulls", "--json")
    # --json gives the canonical reference; tables show the short one.
    pulls = [r for r in json.loads(out)["rows"] if r["image"] == canonical(image)]
    assert code == 0 and {r["outcome"] for r in pulls} == {"pulled"} and len(pulls) == 2

    code, out, _ = await hoist(hoist_stack, "agents")
    assert code == 0 and "agent-1" in out and "agent-2" in out

    code, out, _ = await hoist(hoist_stack, "occupancy", "--json")
    by_owner = {r["owner"]: r for r in json.loads(out)["rows"]}
    assert code == 0 and by_owner["ann"]["kernels"] == 2

    code, out, err = await hoist(hoist_stack, "destroy", session_id)
    assert code == 0, err
    assert out.startswith(f"session {session_id} ")
