"""The last heartbeat of every agent, from ``hoist.heartbeat.<id>`` (core NATS, not events).

Kept in ``agent_heartbeats`` beside the read models (agents_view joins it) and outside them:
no event records a heartbeat, so replay and verify neither rebuild nor compare it.  The latest
heartbeat per agent is written once a second, in one small transaction.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from nats.aio.msg import Msg

from domain import rpc, subjects
from projections.agents import HEARTBEATS
from projections.runner import Runner
from projections.table import Changes, transaction, write
from services.transport.client import Client

log = logging.getLogger(__name__)

FLUSH_S = 1.0


async def listen_heartbeats(nc: Client, runner: Runner, *, flush_s: float = FLUSH_S) -> None:
    """Record heartbeats until cancelled."""
    latest: dict[str, datetime] = {}

    async def on_heartbeat(msg: Msg) -> None:
        if not rpc.is_beat(msg.headers):
            return  # a stored message the server reflected here, not a beat
        try:
            beat = rpc.decode(msg.data, rpc.Heartbeat, "heartbeat")
        except Exception as e:  # a bad heartbeat must not stop the others
            log.warning("ignoring a heartbeat on %s: %s", msg.subject, e)
            return
        if msg.subject == subjects.heartbeat(beat.agent_id):
            latest[beat.agent_id] = max(beat.sent_at, latest.get(beat.agent_id, beat.sent_at))

    sub = await nc.subscribe(f"{subjects.HEARTBEAT}.*", cb=on_heartbeat)
    try:
        while True:
            await asyncio.sleep(flush_s)
            if latest:
                batch = dict(latest)
                latest.clear()
                await asyncio.to_thread(_flush, runner, batch)
    finally:
        await sub.unsubscribe()


def _flush(runner: Runner, beats: dict[str, datetime]) -> None:
    changes = Changes(rows={a: {"agent_id": a, "last_heartbeat_at": at} for a, at in beats.items()})
    with transaction(runner.con) as cur:
        write(cur, HEARTBEATS, HEARTBEATS.name, changes)
