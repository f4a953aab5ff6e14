"""The read commands (ps, sessions, agents, images, occupancy, pulls) as tables and --json, and
destroy, against the stack, with a projection runner and query handlers of the test's own
beside the manager's (the queue group gives each query to one of them)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import duckdb
import pytest
from nats.aio.subscription import Subscription

from domain import subjects
from domain.image_ref import canonical
from eventstore.store import EventStore
from projections import ALL
from projections.runner import Runner
from services.cli.output import human_bytes
from services.manager.queries import serve_queries
from tests.cli.stack_harness import TEST_IMAGE_SIZE, Stack
from transport.client import connect

QUERY_KERNELS = f"{subjects.QUERY}.kernels"


@dataclass
class ReadModels:
    runner: Runner  # this test's, beside the manager's
    subs: list[Subscription]  # its query handlers, in the manager's queue group


@pytest.fixture
async def read_models(hoist_stack: Stack) -> AsyncIterator[ReadModels]:
    nc = await connect(hoist_stack.creds("manager"))
    runner = Runner(
        duckdb.connect(), EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL]), ALL
    )
    task = asyncio.create_task(runner.run(follow=True))
    subs = await serve_queries(nc, runner)
    yield ReadModels(runner, subs)
    for sub in subs:
        await sub.unsubscribe()
    task.cancel()
    await nc.close()


async def reflected(stack: Stack, models: ReadModels, session_id: str) -> None:
    """Until both read models that answer the queries (this test's and the manager's: the
    queue group gives each query to one of them) reflect the session's last event so far.
    `hoist run` returns once the session runs; a model commits what came up to a second later
    (projections.runner.MAX_PAUSE_S), and a query asked at once may find it behind."""
    seq = await models.runner.store.last_seq(subjects.session_events(session_id))
    assert seq > 0 and await models.runner.wait_for(seq, 15), seq
    request = json.dumps({"session_id": session_id, "min_seq": seq, "timeout": 15}).encode()
    nc = await connect(stack.creds("client"))
    try:
        for _ in range(50):  # each asking reaches the manager's models with probability 1/2
            ours = sum(sub.delivered for sub in models.subs)
            reply = json.loads((await nc.request(QUERY_KERNELS, request, timeout=20)).data)
            assert "error" not in reply, reply
            if sum(sub.delivered for sub in models.subs) == ours:
                return  # the manager's models answered it: they reflect seq too
    finally:
        await nc.close()
    raise AssertionError("no query with min_seq reached the manager's read models")


async def hoist(stack: Stack, *args: str) -> tuple[int, str, str]:
    """`hoist ARGS` off this event loop, which meanwhile keeps serving the queries."""
    done = await asyncio.to_thread(stack.hoist, *args)
    return done.returncode, done.stdout, done.stderr


async def test_tables_json_and_destroy(hoist_stack: Stack, read_models: ReadModels) -> None:
    image = hoist_stack.next_image()
    code, out, err = await hoist(hoist_stack, "run", image, "--cluster-size", "2", "--owner", "ann")
    assert code == 0, out + err
    session_id = out.split()[1]
    await reflected(hoist_stack, read_models, session_id)

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
    assert code == 0 and image in out and "is known" not in out
    row = next(line for line in out.splitlines() if image in line)
    assert human_bytes(TEST_IMAGE_SIZE) in row, out  # its size, as the dummy agents were told
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
