"""The persistence module's failures are the library's exception types, with advice an
eventsourcing application can follow, and none of them costs the factory its connection."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from eventsourcing.persistence import DataError, IntegrityError, OperationalError, StoredEvent

from eventstore import Factory
from eventstore.persistence import MAYBE_SAVED, NOT_SAVED
from services.stack.natsserver import NatsCluster, NatsServer
from tests.infra.cluster import stream_leader

TOPIC = "dogs:Dog.Renamed"


def stop(pid: int) -> None:
    """SIGSTOP ``pid`` and return once it is stopped (kill() returns before)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.001)


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
    assert (factory.datastore.store.max_subject_bytes, len(fits)) == (4029, 3009)  # the docs'
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


def test_a_save_the_server_does_not_answer_says_whether_to_read_the_aggregate_again(
    factory: Factory, nats_server: NatsServer
) -> None:
    """A hung server. With the local copy the save is sent at once, so it may be stored once
    the server goes on: the store's advice ("retry with the same idempotency key") is nothing
    an eventsourcing application can do, reading the aggregate again is. Reading from the
    server, the save's first read is not answered: nothing was sent."""
    recorder = factory.application_recorder()
    recorder.insert_events([StoredEvent("fido", 1, TOPIC, b"{}")])
    factory.datastore.store.timeout = 0.5
    copy = factory.datastore.copy.enabled
    assert nats_server.proc is not None
    stop(nats_server.proc.pid)
    try:
        with pytest.raises(OperationalError) as raised:
            recorder.insert_events([StoredEvent("fido", 2, TOPIC, b"{}")])
        message = str(raised.value)
        assert "idempotency" not in message
        if copy:
            assert "did not acknowledge the append" in message
            assert message.endswith(MAYBE_SAVED), message
        else:
            assert "did not answer a direct get" in message
            assert message.endswith(NOT_SAVED), message
            with pytest.raises(OperationalError, match=r"did not answer a direct get.*; retry$"):
                recorder.select_events("fido")
    finally:
        os.kill(nats_server.proc.pid, signal.SIGCONT)
    if copy:  # stored after all (once the server goes on): retried without a read, it conflicts
        deadline = time.monotonic() + 10
        while len(recorder.select_events("fido")) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
            recorder.catch_up()
        with pytest.raises(IntegrityError):
            recorder.insert_events([StoredEvent("fido", 2, TOPIC, b"{}")])
    else:
        assert len(recorder.select_events("fido")) == 1
        recorder.insert_events([StoredEvent("fido", 2, TOPIC, b"{}")])
    assert recorder.insert_events([StoredEvent("fido", 3, TOPIC, b"{}")]) == [3]


def test_a_save_while_the_stream_has_no_leader_says_so(nats_cluster: NatsCluster) -> None:
    """A failover's save got "no stream takes ...: call ensure_stream() first" (the answer of
    a stream electing a leader is "no responders"). Here the stream keeps no leader: two of
    its three nodes are gone, the factory is connected to the third."""
    nodes = nats_cluster.nodes
    first = Factory({"NATS_URL": nats_cluster.url, "NATS_STREAM": "dogs"})
    try:
        first.application_recorder().insert_events([StoredEvent("fido", 1, TOPIC, b"{}")])
        nc = first.datastore._nc
        assert nc is not None
        leader = first.datastore.run(stream_leader(nc, "dogs"))
    finally:
        first.close()
    survivor = next(i for i, node in enumerate(nodes) if node.name != leader)
    factory = Factory({"NATS_URL": nodes[survivor].url, "NATS_STREAM": "dogs"})
    try:
        recorder = factory.application_recorder()
        factory.datastore.store.timeout = 1.0
        assert len(recorder.select_events("fido")) == 1  # the copy has the aggregate
        for i in range(len(nodes)):
            if i != survivor:
                nats_cluster.kill(i)
        messages: list[str] = []
        deadline = time.monotonic() + 60
        while not any("did not take the append" in m for m in messages):
            assert time.monotonic() < deadline, messages
            with pytest.raises(OperationalError) as raised:
                recorder.insert_events([StoredEvent("fido", 2, TOPIC, b"{}")])
            messages.append(str(raised.value))
            time.sleep(0.2)
        for message in messages:
            assert "ensure_stream" not in message and "idempotency" not in message, message
            assert message.endswith((MAYBE_SAVED, f"{NOT_SAVED} later", NOT_SAVED)), message
        assert "without a quorum of its nodes" in messages[-1]
        assert messages[-1].endswith(NOT_SAVED)
    finally:
        factory.close()
