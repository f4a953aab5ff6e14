"""The persistence module's failures are the library's exception types, with advice an
eventsourcing application can follow, and none of them costs the factory its connection."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from eventsourcing.persistence import DataError, StoredEvent

from services.eventstore import Factory
from services.stack.natsserver import NatsServer

TOPIC = "dogs:Dog.Renamed"


@pytest.fixture(params=["copy", "server"])
def factory(nats_server: NatsServer, request: pytest.FixtureRequest) -> Iterator[Factory]:
    """A factory reading from its local copy, or from the server (NATS_LOCAL_COPY_MB=0)."""
    copy_mb = "256" if request.param == "copy" else "0"
    env = {"NATS_URL": nats_server.url, "NATS_STREAM": "dogs", "NATS_LOCAL_COPY_MB": copy_mb}
    factory = Factory(env)
    yield factory
    factory.close()


def test_what_nats_server_would_not_take_is_a_data_error_and_the_factory_goes_on(
    factory: Factory,
) -> None:
    """An originator id of 3,300 characters made nats-server close the connection ("maximum
    control line exceeded") after a 5 s wait, and every later save failed."""
    recorder = factory.application_recorder()
    longest = factory.datastore.store.max_subject_bytes - len("es.dogs.events.s")
    fits = "x" * (longest * 3 // 4)
    assert recorder.insert_events([StoredEvent(fits, 1, TOPIC, b"{}")]) == [1]
    assert [e.state for e in recorder.select_events(fits)] == [b"{}"]

    too_long = "x" * 3300
    with pytest.raises(DataError, match=rf"most {len(fits)} UTF-8 bytes") as raised:
        recorder.insert_events([StoredEvent(too_long, 1, TOPIC, b"{}")])
    assert "max_control_line 4096" in str(raised.value)
    # Reads of such an id find nothing, and ask the server without breaking the connection.
    assert recorder.select_events(too_long) == []
    assert recorder.select_events(too_long, desc=True, limit=1) == []
    with pytest.raises(DataError, match="one save holds at most 1000 records"):
        recorder.insert_events([StoredEvent("many", v, TOPIC, b"{}") for v in range(1, 1002)])
    max_payload = factory.datastore.store.nc.max_payload
    with pytest.raises(DataError, match=f"over the server's max_payload of {max_payload}"):
        recorder.insert_events([StoredEvent("big", 1, TOPIC, b"x" * (2 << 20))])
    with pytest.raises(DataError, match="max_payload"):  # over it only with the headers
        recorder.insert_events([StoredEvent("big", 1, TOPIC, b"x" * (max_payload - 20))])

    assert recorder.insert_events([StoredEvent("rex", 1, TOPIC, b"{}")]) == [2]
    assert [n.id for n in recorder.select_notifications(None, 10)] == [1, 2]
    assert recorder.max_notification_id() == 2
