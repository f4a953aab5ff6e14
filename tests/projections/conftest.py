"""A real event store and the read-model helpers the projection tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import duckdb
import pytest
from nats.aio.client import Client

from domain import subjects
from projections.runner import Runner
from services.eventstore.repository import Repository
from services.eventstore.store import EventStore


@pytest.fixture
async def store(nc: Client) -> AsyncIterator[EventStore]:
    store = EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
    await store.ensure_stream()
    yield store


@pytest.fixture
def repo(store: EventStore) -> Repository:
    return Repository(store)


def rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cur = con.cursor()
    result = cur.execute(sql)
    names = [d[0] for d in result.description]
    return [dict(zip(names, r, strict=True)) for r in result.fetchall()]


async def rebuilt(store: EventStore, until_seq: int | None = None) -> duckdb.DuckDBPyConnection:
    """Every read model from scratch, in memory."""
    con = duckdb.connect()
    await Runner(con, store).run(follow=False, until_seq=until_seq)
    return con
