"""A ready event store on the real nats-server of ``tests/conftest.py``."""

from __future__ import annotations

import pytest

from domain import subjects
from eventstore.store import EventStore
from transport.client import Client


@pytest.fixture
async def store(nc: Client) -> EventStore:
    store = EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
    await store.ensure_stream()
    return store
