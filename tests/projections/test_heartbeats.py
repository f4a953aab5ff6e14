"""Heartbeats (core NATS) reach agents_view's last_heartbeat_at, outside the rebuilt models."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import duckdb
import msgspec

from domain import rpc, subjects
from projections.heartbeats import listen_heartbeats
from projections.runner import Runner
from projections.verify import compare, snapshot
from services.eventstore.repository import Repository
from services.eventstore.store import EventStore
from services.transport.client import Client
from tests.projections.conftest import rebuilt, rows, scripted_history


async def test_last_heartbeat(nc: Client, store: EventStore, repo: Repository) -> None:
    await scripted_history(repo, sessions=2)
    runner = Runner(duckdb.connect(), store)
    await runner.run(follow=False)
    listener = asyncio.create_task(listen_heartbeats(nc, runner, flush_s=0.05))
    await asyncio.sleep(0.05)  # subscribed
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
            found = rows(runner.con, "SELECT agent_id, last_heartbeat_at FROM agents_view")
            if any(r["last_heartbeat_at"] for r in found):
                break
            await asyncio.sleep(0.05)
    finally:
        listener.cancel()
    assert {r["agent_id"]: r["last_heartbeat_at"] for r in found} == {
        "agent-0": None,
        "agent-1": sent,
    }
    _, live = snapshot(runner.con)
    assert compare(live, await rebuilt(store)) == []  # heartbeats are no part of the models
