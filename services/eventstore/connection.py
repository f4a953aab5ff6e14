"""NATS connection helpers shared by the agent and the manager."""

from __future__ import annotations

from nats.aio.client import Client


async def subscriptions_ready(nc: Client) -> None:
    """Return once the server has every subscription made so far on ``nc``.

    nats-py 2.16's flush() writes its PING straight to the socket, ahead of SUBs still in the
    client's buffer, so one flush can return before the server knows a new subscription and a
    request sent right after finds no responders. The first flush pushes the buffer out; the
    second PING goes after it, so its PONG proves the SUBs arrived.
    """
    await nc.flush()
    await nc.flush()
