"""The persistence module's local copy of the stream (eventstore/persistence_copy.py):
reads answered from memory keep the library's semantics.

Own appends are read back at once from any thread; a stale copy never lets a conflicting
append through (IntegrityError) nor refuses a valid one; readers never see a gap in the
notification ids; another process's appends are seen after catch_up() (and by the follower on
its own, by subscribe, by a not-found get); a stream that outgrows the bound is read from the
server.  Each test runs a real nats-server (tests/conftest.py); "another process" is another
Factory with its own connection and copy.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from uuid import UUID

import pytest
from eventsourcing.persistence import IntegrityError, Notification, StoredEvent, Tracking

from eventstore import Factory
from eventstore.persistence import JetStreamApplicationRecorder, JetStreamProcessRecorder
from services.stack.natsserver import NatsServer


def _event(originator_id: UUID, version: int, state: bytes = b"{}") -> StoredEvent:
    return StoredEvent(originator_id, version, "topic", state)


@pytest.fixture
def factories(nats_server: NatsServer) -> Iterator[list[Factory]]:
    """Two processes' factories on one stream."""
    made = [Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "copy"}) for _ in range(2)]
    yield made
    for factory in made:
        factory.close()


def _recorder(factory: Factory) -> JetStreamProcessRecorder:
    recorder = factory.process_recorder()
    assert isinstance(recorder, JetStreamProcessRecorder)
    return recorder


def test_own_appends_are_read_back_at_once_from_other_threads(factories: list[Factory]) -> None:
    recorder = _recorder(factories[0])
    assert recorder.datastore.copy.enabled
    written: list[tuple[UUID, int]] = []
    failures: list[str] = []
    ready = threading.Event()
    done = threading.Event()

    def writer() -> None:
        for _ in range(200):
            a = uuid.uuid4()
            [seq] = recorder.insert_events([_event(a, 1)])
            written.append((a, seq))
            ready.set()
        done.set()

    def reader() -> None:
        assert ready.wait(10)
        while not done.is_set():
            a, seq = written[-1]  # acknowledged before this read started
            if [e.originator_version for e in recorder.select_events(a)] != [1]:
                failures.append(f"{a} not read back")
            ids = [n.id for n in recorder.select_notifications(seq, 1)]
            if ids != [seq]:
                failures.append(f"notification {seq} not read back: {ids}")

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert len(written) == 200


def test_a_stale_copy_never_decides_a_conflict_wrongly(factories: list[Factory]) -> None:
    mine, theirs = _recorder(factories[0]), _recorder(factories[1])
    a = uuid.uuid4()
    mine.insert_events([_event(a, 1)])
    theirs.catch_up()
    theirs.insert_events([_event(a, 2)])  # my copy may not have it yet

    # A version the other process took: refused, whatever my copy held, nothing written.
    b = uuid.uuid4()
    with pytest.raises(IntegrityError):
        mine.insert_events([_event(b, 1), _event(a, 2)])
    assert mine.select_events(b) == []
    # The re-read taught my copy about version 2: my reads never go back before it.
    assert [e.originator_version for e in mine.select_events(a)] == [1, 2]

    # A valid next version goes through though my copy was behind when I planned it.
    theirs.insert_events([_event(a, 3)])
    mine.insert_events([_event(a, 4)])
    theirs.catch_up()
    assert [e.originator_version for e in theirs.select_events(a)] == [1, 2, 3, 4]
    assert [n.originator_version for n in mine.select_notifications(1, 10)] == [1, 2, 3, 4]

    # Tracking ids likewise.
    theirs.insert_events([], tracking=Tracking("up", 7))
    with pytest.raises(IntegrityError):
        mine.insert_events([_event(uuid.uuid4(), 1)], tracking=Tracking("up", 7))
    assert mine.max_tracking_id("up") == 7
    mine.insert_events([], tracking=Tracking("up", 8))
    assert theirs.max_tracking_id("up") == 8


def test_readers_never_see_a_gap_while_eight_threads_append(factories: list[Factory]) -> None:
    writer, reader = _recorder(factories[0]), _recorder(factories[1])
    seen: list[int] = []  # lengths of the answers
    gaps: list[list[int]] = []
    stop = threading.Event()

    def write(n: int) -> None:
        for _ in range(120):
            writer.insert_events([_event(uuid.uuid4(), 1)])

    def read(recorder: JetStreamApplicationRecorder) -> None:
        while not stop.is_set():
            ids = [n.id for n in recorder.select_notifications(1, 10_000)]
            # Every answer is a prefix of the stream (only these events on it): nothing skipped.
            if ids != list(range(1, len(ids) + 1)):
                gaps.append(ids)
            seen.append(len(ids))
            time.sleep(0.001)  # leave the writers the GIL

    readers = [threading.Thread(target=read, args=(r,)) for r in (writer, reader)]
    writers = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()

    reader.catch_up()
    final = [n.id for n in reader.select_notifications(1, 10_000)]
    assert final == list(range(1, 8 * 120 + 1))
    assert gaps == []
    assert len(set(seen)) > 2  # the readers saw the log grow


def test_another_process_s_appends_are_seen(factories: list[Factory]) -> None:
    mine, theirs = _recorder(factories[0]), _recorder(factories[1])
    mine.insert_events([_event(uuid.uuid4(), 1)])  # both copies running past the open
    a = uuid.uuid4()
    [seq] = theirs.insert_events([_event(a, 1, b"one")])

    # Not found is always confirmed with the server: found at once.
    assert [e.state for e in mine.select_events(a)] == [b"one"]
    assert mine.max_notification_id() == seq

    # After catch_up(), every read sees it; without, the follower brings it soon.
    theirs.insert_events([_event(a, 2, b"two")])
    mine.catch_up()
    assert [e.state for e in mine.select_events(a)] == [b"one", b"two"]
    [seq3] = theirs.insert_events([_event(a, 3, b"three")])
    deadline = time.monotonic() + 5
    while [n.id for n in mine.select_notifications(seq3, 1)] != [seq3]:
        assert time.monotonic() < deadline, "the follower did not bring another process's append"
        time.sleep(0.001)

    # subscribe() sees them all, and live ones as they come.
    with mine.subscribe(gt=0) as subscription:
        got: list[Notification] = []
        for notification in subscription:
            got.append(notification)
            if len(got) == 4:
                theirs.insert_events([_event(a, 4, b"four")])
            if len(got) == 5:
                break
    assert [n.state for n in got[1:]] == [b"one", b"two", b"three", b"four"]


def test_a_stream_past_the_bound_is_read_from_the_server(nats_server: NatsServer) -> None:
    env = {"NATS_URL": nats_server.url, "NATS_STREAM": "big", "NATS_LOCAL_COPY_MB": "0.05"}
    factory = Factory(env)
    try:
        recorder = _recorder(factory)
        assert recorder.datastore.copy.enabled
        a = uuid.uuid4()
        for version in range(1, 101):  # ~100 KB: twice the bound
            recorder.insert_events([_event(a, version, b"x" * 1000)])
        recorder.catch_up()
        deadline = time.monotonic() + 5
        while recorder.datastore.copy.enabled:
            assert time.monotonic() < deadline, "the copy outgrew its bound and stayed"
            time.sleep(0.01)
        assert len(recorder.select_events(a)) == 100
        assert recorder.max_notification_id() == 100
        with pytest.raises(IntegrityError):
            recorder.insert_events([_event(a, 100)])
        recorder.insert_events([_event(a, 101)])
        assert [n.id for n in recorder.select_notifications(99, 10)] == [99, 100, 101]
    finally:
        factory.close()

    # Opened on a stream already past the bound: no copy at all, the same answers.
    again = Factory(env)
    try:
        recorder = _recorder(again)
        assert not recorder.datastore.copy.enabled
        assert len(recorder.select_events(a)) == 101
        assert recorder.max_notification_id() == 101
    finally:
        again.close()


def test_a_copy_opened_on_a_stream_catches_up_with_it(factories: list[Factory]) -> None:
    writer = _recorder(factories[0])
    ids = [uuid.uuid4() for _ in range(1500)]  # more than one page of the follower's reads
    for start in range(0, 1500, 500):
        writer.insert_events([_event(a, 1) for a in ids[start : start + 500]])
    late = Factory(
        {"NATS_URL": factories[0].datastore.url, "NATS_STREAM": factories[0].datastore.stream}
    )
    try:
        recorder = _recorder(late)
        # Before and after the copy holds the stream as it was at the open: the same answers.
        assert [e.originator_version for e in recorder.select_events(ids[-1])] == [1]
        assert len(recorder.select_notifications(1, 2000)) == 1500
        deadline = time.monotonic() + 10
        while recorder.datastore.copy.head < 1500:
            assert time.monotonic() < deadline, "the copy did not catch up"
            time.sleep(0.01)
        assert [e.originator_version for e in recorder.select_events(ids[-1])] == [1]
        assert [n.id for n in recorder.select_notifications(1, 2000)] == list(range(1, 1501))
        recorder.insert_events([_event(ids[0], 2)])
        assert [e.originator_version for e in recorder.select_events(ids[0])] == [1, 2]
    finally:
        late.close()


def test_the_copy_follows_on_after_the_server_restarts(nats_server: NatsServer) -> None:
    factory = Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "restart"})
    other = Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "restart"})
    try:
        mine, theirs = _recorder(factory), _recorder(other)
        a = uuid.uuid4()
        mine.insert_events([_event(a, 1)])
        nats_server.stop()
        nats_server.start()
        deadline = time.monotonic() + 30
        while True:  # until the connection is back
            try:
                theirs.insert_events([_event(a, 2)])
                break
            except Exception:
                assert time.monotonic() < deadline, "no reconnect"
                time.sleep(0.2)
        deadline = time.monotonic() + 10
        while len(mine.select_notifications(1, 10)) < 2:  # the follower alone brings it
            assert time.monotonic() < deadline, "the copy stopped following"
            time.sleep(0.01)
        assert mine.datastore.copy.enabled
        assert [e.originator_version for e in mine.select_events(a)] == [1, 2]
    finally:
        factory.close()
        other.close()


def test_a_subscription_gets_own_appends_live(factories: list[Factory]) -> None:
    """The factory's own connection hears no echo of its appends; subscriptions follow on a
    second one that does, so they wake at once, not at their once-a-second poll."""
    recorder = _recorder(factories[0])
    with recorder.subscribe(gt=0) as subscription:
        for version in range(1, 6):
            start = time.monotonic()
            [seq] = recorder.insert_events([_event(uuid.uuid4(), version)])
            assert next(subscription).id == seq
            assert time.monotonic() - start < 0.5
