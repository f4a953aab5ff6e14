"""NATS connection helpers shared by the agent and the manager."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Coroutine, Iterable
from typing import Any, Protocol

import nats.errors
from nats.aio.subscription import Subscription

from transport.client import Client, connect


async def subscriptions_ready(nc: Client) -> None:
    """Return once the server has every subscription made so far on ``nc``.

    nats-py 2.16's flush() writes its PING straight to the socket, ahead of SUBs still in the
    client's buffer, so one flush can return before the server knows a new subscription and a
    request sent right after finds no responders. The first flush pushes the buffer out; the
    second PING goes after it, so its PONG proves the SUBs arrived.
    """
    await nc.flush()
    await nc.flush()


async def unsubscribe_all(subs: Iterable[Subscription | None]) -> None:
    """End these subscriptions (None: none made); one the connection already closed is no
    error at stop."""
    for sub in subs:
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


class CredentialsRefused(ValueError):
    """The NATS server refused this process's user or password: retrying cannot help."""


async def connect_for_ever(url: str, name: str, log: logging.Logger) -> Client:
    """Connect a long-running process (manager, agent): reconnect for ever after an outage
    (nats-py's default gives up after about 2 minutes and the process would live on without
    NATS), one log line per failed attempt instead of nats-py's traceback, and refused
    credentials end the attempt at once with CredentialsRefused: that retry would never work."""
    refused = asyncio.Event()

    async def on_error(e: Exception) -> None:
        if "authorization violation" in str(e).lower():
            refused.set()
        log.warning("nats: %s", e)

    connecting = asyncio.ensure_future(
        connect(
            url,
            name=name,
            error_cb=on_error,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
        )
    )
    denied = asyncio.ensure_future(refused.wait())
    done, _ = await asyncio.wait({connecting, denied}, return_when=asyncio.FIRST_COMPLETED)
    denied.cancel()
    if connecting not in done:
        connecting.cancel()
        raise CredentialsRefused(
            f"NATS refused the credentials of {name}: get current ones with `hoist creds`"
        )
    return connecting.result()


class Service(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


async def serve_until_signalled(nc: Client, service: Service, ready: str) -> None:
    """Run a long-running process's ``service`` on ``nc`` until SIGTERM or SIGINT: start it,
    print ``ready`` (supervisors and tests wait for that line), then stop it and drain."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await service.start()
        # Ready means answering: a request sent on the line's word finds the subscriptions.
        await subscriptions_ready(nc)
        print(ready, flush=True)
        await stop.wait()
    finally:
        await service.stop()
        await nc.drain()


def run_process(
    prog: str, log_level: str, service: Coroutine[Any, Any, None], connect_hint: str
) -> int:
    """A process's main: log at ``log_level``, run ``service`` until it ends, and turn what a
    user can fix into one line on stderr and an exit code (2: bad options or files, 1: NATS
    unreachable, ``connect_hint`` saying what to check)."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    try:
        asyncio.run(service)
    except (ValueError, FileNotFoundError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except (OSError, nats.errors.Error) as e:  # the message names the address, not the password
        print(f"{prog}: cannot connect to NATS ({e}): {connect_hint}", file=sys.stderr)
        return 1
    return 0
