"""Helpers for tests on a JetStream cluster (the ``nats_cluster`` fixture, or a `hoist up
--nats-nodes 3` stack): which node leads a stream, and waiting for a new leader."""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client as NatsClient


async def stream_leader(nc: NatsClient, stream: str, within_s: float = 30.0) -> str:
    """The server name of ``stream``'s leader, once it has one (after a leader's loss the
    others elect a new one within seconds)."""
    deadline = time.monotonic() + within_s
    js = nc.jetstream()
    while True:
        try:
            info = await js.stream_info(stream)
            if info.cluster is not None and info.cluster.leader:
                return info.cluster.leader
        except Exception:  # no leader yet: the API times out or answers an error
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {stream} has no leader after {within_s}s")
        await asyncio.sleep(0.2)
