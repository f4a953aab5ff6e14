"""ensure_stream: creates the event stream when absent; of an existing one it verifies every
setting that keeps the log whole and never changes it."""

from __future__ import annotations

import re

import pytest
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError

from eventstore.store import EventStore, StoreError
from transport.client import Client


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


async def test_verifies_an_existing_stream_and_never_updates_it(nc: Client) -> None:
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(name="EV", subjects=["ev.>"], storage=StorageType.FILE, max_msgs=10)
    )
    await js.publish("ev.x", b"1")
    with pytest.raises(StoreError) as refused:
        await EventStore(nc, "EV", ["ev.>", "more.>"]).ensure_stream()
    message = str(refused.value)
    assert "max_msgs is 10, needs -1" in message
    assert "subjects is ['ev.>'], needs ['ev.>', 'more.>']" in message
    assert "deny_purge is False, needs True" in message
    assert "allow_atomic is False, needs True" in message
    assert "never changes it" in message and "nats stream edit EV" in message
    info = await js.stream_info("EV")  # untouched
    assert (info.config.max_msgs, info.config.subjects, info.state.messages) == (10, ["ev.>"], 1)


@pytest.mark.parametrize(
    ("setting", "value", "expected"),
    [
        ("max_age", 3600.0, "max_age is 3600, needs 0"),
        ("max_bytes", 1 << 20, "max_bytes is 1048576, needs -1"),
        ("max_msgs_per_subject", 5, "max_msgs_per_subject is 5, needs -1"),
        ("duplicate_window", 60.0, "duplicate_window is 60, needs 120"),
        ("allow_direct", False, "allow_direct is False, needs True"),
        ("deny_delete", False, "deny_delete is False, needs True"),
        ("discard", DiscardPolicy.NEW, "discard is new, needs old"),
        ("retention", RetentionPolicy.INTEREST, "retention is interest, needs limits"),
    ],
)
async def test_each_setting_that_keeps_the_log_is_verified(
    nc: Client, setting: str, value: object, expected: str
) -> None:
    store = EventStore(nc, "EV", ["ev.>"])
    config = store.stream_config()
    setattr(config, setting, value)
    await store.js.add_stream(config)
    with pytest.raises(StoreError, match=re.escape(expected)) as refused:
        await store.ensure_stream()
    assert str(refused.value).count(", needs ") == 1, "only the one setting differs"
    assert getattr((await store.js.stream_info("EV")).config, setting) == value


async def test_a_stream_made_before_leases_is_taken_without_ttls(nc: Client) -> None:
    """allow_msg_ttl is for the managers' lease only: a log made before it still serves (one
    manager leads it unleased); a new stream has it."""
    old = EventStore(nc, "OLD", ["old.>"])
    config = old.stream_config()
    config.allow_msg_ttl = False
    await old.js.add_stream(config)
    await old.ensure_stream()
    assert old.msg_ttl is False
    new = EventStore(nc, "EV", ["ev.>"])
    await new.ensure_stream()
    assert new.msg_ttl is True
    assert (await new.js.stream_info("EV")).config.allow_msg_ttl is True


async def test_refuses_a_memory_stream_by_name(nc: Client) -> None:
    await nc.jetstream().add_stream(
        StreamConfig(name="EV", subjects=["ev.>"], storage=StorageType.MEMORY)
    )
    with pytest.raises(StoreError, match="storage is memory, needs file"):
        await EventStore(nc, "EV", ["ev.>"]).ensure_stream()


def test_duplicate_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="duplicate_window"):
        EventStore(None, "EV", ["ev.>"], duplicate_window=0)  # type: ignore[arg-type]
