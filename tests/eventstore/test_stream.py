"""ensure_stream: creates the event stream, repairs an existing one, refuses what it cannot fix."""

from __future__ import annotations

import pytest
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import APIError

from services.eventstore.client import Client
from services.eventstore.store import EventStore, StoreError


async def test_creates_the_stream_as_an_append_only_log(nc: Client) -> None:
    store = EventStore(nc, "EV", ["ev.>"], duplicate_window=30)
    await store.ensure_stream()
    await store.ensure_stream()  # idempotent
    config = (await store.js.stream_info("EV")).config
    assert config.storage == StorageType.FILE
    assert (config.deny_delete, config.deny_purge) == (True, True)
    assert (config.allow_atomic, config.allow_direct) == (True, True)
    assert config.duplicate_window == 30
    await store.js.publish("ev.x", b"1")
    with pytest.raises(APIError):
        await store.js.purge_stream("EV")
    with pytest.raises(APIError):
        await store.js.delete_msg("EV", 1)


async def test_updates_an_existing_stream_that_lacks_settings(nc: Client) -> None:
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(name="EV", subjects=["ev.>"], storage=StorageType.FILE, max_msgs=10)
    )
    await EventStore(nc, "EV", ["ev.>", "more.>"]).ensure_stream()
    config = (await js.stream_info("EV")).config
    assert config.allow_atomic and config.allow_direct and config.deny_delete
    assert config.max_msgs == -1
    assert sorted(config.subjects or []) == ["ev.>", "more.>"]


async def test_refuses_a_memory_stream_by_name(nc: Client) -> None:
    await nc.jetstream().add_stream(
        StreamConfig(name="EV", subjects=["ev.>"], storage=StorageType.MEMORY)
    )
    with pytest.raises(StoreError, match="file storage"):
        await EventStore(nc, "EV", ["ev.>"]).ensure_stream()


def test_duplicate_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="duplicate_window"):
        EventStore(None, "EV", ["ev.>"], duplicate_window=0)  # type: ignore[arg-type]
