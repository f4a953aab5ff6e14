"""Connections as the roles a hostile writer would use, on the role-checked server of
tests/test_roles.py (one per module)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from domain.subjects import EVENT_STREAM, EVENTS_ALL
from eventstore.store import EventStore
from tests.test_roles import Conn, _connect, stack  # noqa: F401 - the `stack` fixture


@pytest.fixture
async def conns(stack: Any) -> AsyncIterator[dict[str, Conn]]:  # noqa: F811
    """The manager (who made the stream) and agents A and B, each with its own user."""
    out = {
        "manager": await _connect(stack, "manager"),
        "A": await _connect(stack, "agent", "A"),
        "B": await _connect(stack, "agent", "B"),
    }
    await role_store(out["manager"]).ensure_stream()
    yield out
    for conn in out.values():
        await conn.nc.close()


def role_store(conn: Conn) -> EventStore:
    """The event store as ``conn``'s role sees it."""
    return EventStore(conn.nc, EVENT_STREAM, [EVENTS_ALL])
