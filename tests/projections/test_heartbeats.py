"""Heartbeats (core NATS) reach the agents query's last_heartbeat_at from the liveness watcher's
live table, joined in at reply time: no part of the read models."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import duckdb
import msgspec

from domain import rpc, subjects
from eventstore.repository import Repository
from eventstore.store import EventStore
from projections import ALL
from projections.runner import Runner
from projections.verify import compare, snapshot
from services.manager.liveness import LivenessWatcher
from services.manager.queries import serve_queries
from tests.projections.conftest import rebuilt, scripted_history
from transport.client import Client


async def _agents(nc: Client) -> list[dict[str, Any]]:
    reply = await nc.request(f"{subjects.QUERY}.agents", b"{}", timeout=10)
    found: list[dict[str, Any]] = json.loads(reply.data)["rows"]
    for r in found:
        at = r["last_heartbeat_at"]
        r["last_heartbeat_at"] = None if at is None else datetime.fromisoformat(at)
    return found


async def test_last_heartbeat(nc: Client, store: EventStore, repo: Repository) -> None:
    await scripted_history(repo, sessions=2)
    runner = Runner(duckdb.connect(), store, ALL)
    await runner.run(follow=False)
    watcher = LivenessWatcher(nc, repo)
    await watcher.start()
    subs = await serve_queries(nc, runner, last_heartbeat=watcher.last_heartbeat_at)
    sent = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    beat = rpc.Heartbeat(
        agent_id="agent-1",
        sent_at=sent,
        kernels=[],
        free=rpc.FreeCapacity(cpu=1.0, mem=1, disk=1),
        images=[],
        pulls={},
    )
    beat_headers = {rpc.BEAT_HEADER: "1"}
    await nc.publish(subjects.heartbeat("agent-1"), rpc.encode(beat), headers=beat_headers)
    await nc.publish(subjects.heartbeat("agent-0"), b"not json", headers=beat_headers)  # ignored
    # No beat without its header (a stored message reflected here), however well formed.
    early = msgspec.structs.replace(beat, agent_id="agent-0")
    await nc.publish(subjects.heartbeat("agent-0"), rpc.encode(early))
    try:
        for _ in range(100):
            found = await _agents(nc)
            if any(r["last_heartbeat_at"] for r in found):
                break
            await asyncio.sleep(0.05)
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await watcher.stop()
    assert {r["agent_id"]: r["last_heartbeat_at"] for r in found} == {
        "agent-0": None,
        "agent-1": sent,
    }
    _, live = snapshot(runner.con)
    assert compare(live, await rebuilt(store)) == []  # heartbeats are no part of the models
