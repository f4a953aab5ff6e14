"""Plain eventsourcing applications on JetStream through PERSISTENCE_MODULE, unchanged.

Each test gets its own real nats-server (``nats_server`` from tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import IntegrityError, OperationalError, StoredEvent, Tracking
from eventsourcing.projection import EventSourcedProjectionRunner
from eventsourcing.system import ProcessApplication, SingleThreadedRunner, System
from eventsourcing.tests.projection import Counters

from eventstore import Factory
from eventstore.persistence import JetStreamProcessRecorder, id_token, token_id
from services.stack.natsserver import NatsServer, free_port
from transport.client import connect


class Dog(Aggregate):
    @event("Registered")
    def __init__(self, name: str) -> None:
        self.name = name
        self.tricks: list[str] = []

    @event("TrickAdded")
    def add_trick(self, trick: str) -> None:
        self.tricks.append(trick)


class DogSchool(Application[UUID]):
    def register_dog(self, name: str) -> UUID:
        dog = Dog(name)
        self.save(dog)
        return dog.id

    def add_trick(self, dog_id: UUID, trick: str) -> None:
        dog: Dog = self.repository.get(dog_id)
        dog.add_trick(trick)
        self.save(dog)

    def get_dog(self, dog_id: UUID) -> dict[str, Any]:
        dog: Dog = self.repository.get(dog_id)
        return {"name": dog.name, "tricks": tuple(dog.tricks)}


@pytest.fixture
def env(nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The process environment an operator would set; the applications read it themselves."""
    values = {
        "PERSISTENCE_MODULE": "eventstore:Factory",
        "NATS_URL": nats_server.url,
        "NATS_STREAM": "dogs",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    yield values


# services.eventstore:Factory: the old path, an alias kept for applications configured with it
@pytest.mark.parametrize(
    "module", ["eventstore:Factory", "eventstore.persistence", "services.eventstore:Factory"]
)
def test_plain_application_runs_unchanged(
    env: dict[str, str], module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERSISTENCE_MODULE", module)
    school = DogSchool()
    try:
        assert type(school.factory) is Factory
        dog_id = school.register_dog("Fido")
        school.add_trick(dog_id, "roll over")
        school.add_trick(dog_id, "play dead")
        assert school.get_dog(dog_id) == {"name": "Fido", "tricks": ("roll over", "play dead")}

        section = school.notification_log["1,10"]
        assert [item.id for item in section.items] == [1, 2, 3]
        assert [item.originator_version for item in section.items] == [1, 2, 3]
    finally:
        school.close()

    # Another process (here: another instance) sees the same history in the stream.
    again = DogSchool()
    try:
        assert again.get_dog(dog_id)["tricks"] == ("roll over", "play dead")
        assert again.recorder.max_notification_id() == 3
    finally:
        again.close()


def test_snapshots_are_kept_apart_from_notifications(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IS_SNAPSHOTTING_ENABLED", "y")
    school = DogSchool()
    try:
        dog_id = school.register_dog("Rex")
        school.add_trick(dog_id, "sit")
        school.take_snapshot(dog_id)
        school.add_trick(dog_id, "stay")
        assert school.snapshots is not None
        assert [s.originator_version for s in school.snapshots.get(dog_id)] == [2]
        assert school.get_dog(dog_id)["tricks"] == ("sit", "stay")
        # The snapshot took a stream sequence but is no notification.
        notes = school.notification_log.select(start=1, limit=10)
        assert [(n.id, n.originator_version) for n in notes] == [(1, 1), (2, 2), (4, 3)]
    finally:
        school.close()


def test_two_streams_on_one_server_are_isolated(env: dict[str, str]) -> None:
    kennel = DogSchool(env={"NATS_STREAM": "kennel"})
    shelter = DogSchool(env={"NATS_STREAM": "shelter"})
    try:
        fido = kennel.register_dog("Fido")
        kennel.add_trick(fido, "fetch")
        rex = shelter.register_dog("Rex")

        assert kennel.recorder.max_notification_id() == 2
        assert shelter.recorder.max_notification_id() == 1  # its own sequence space
        assert [n.originator_id for n in shelter.notification_log.select(1, 10)] == [rex]
        with pytest.raises(AggregateNotFoundError):
            shelter.repository.get(fido)
        with pytest.raises(AggregateNotFoundError):
            kennel.repository.get(rex)
    finally:
        kennel.close()
        shelter.close()


def test_version_conflict_raises_integrity_error_and_writes_nothing(env: dict[str, str]) -> None:
    first, second = DogSchool(), DogSchool()
    try:
        dog_id = first.register_dog("Fido")
        mine: Dog = first.repository.get(dog_id)
        theirs: Dog = second.repository.get(dog_id)
        mine.add_trick("sit")
        theirs.add_trick("beg")
        other = Dog("Bello")  # saved in the same call as the conflicting event
        first.save(mine)

        with pytest.raises(IntegrityError):
            second.save(theirs, other)

        assert second.get_dog(dog_id)["tricks"] == ("sit",)
        with pytest.raises(AggregateNotFoundError):
            second.repository.get(other.id)
        assert second.recorder.max_notification_id() == 2
    finally:
        first.close()
        second.close()


@pytest.fixture
def process_recorder(nats_server: NatsServer) -> Iterator[JetStreamProcessRecorder]:
    factory = Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "process"})
    recorder = factory.process_recorder()
    assert isinstance(recorder, JetStreamProcessRecorder)
    yield recorder
    factory.close()


def _event(originator_id: UUID, version: int) -> StoredEvent:
    return StoredEvent(originator_id, version, "topic", b"{}")


def test_process_insert_with_tracking_is_atomic(
    process_recorder: JetStreamProcessRecorder,
) -> None:
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    process_recorder.insert_events([_event(a, 1)], tracking=Tracking("up", 5))

    # A stale tracking id refuses the events with it.
    with pytest.raises(IntegrityError):
        process_recorder.insert_events([_event(b, 1)], tracking=Tracking("up", 5))
    assert process_recorder.select_events(b) == []

    # A conflicting event refuses the other events and the tracking record with it.
    with pytest.raises(IntegrityError):
        process_recorder.insert_events([_event(c, 1), _event(a, 1)], tracking=Tracking("up", 6))
    assert process_recorder.select_events(c) == []
    assert process_recorder.max_tracking_id("up") == 5
    assert process_recorder.max_notification_id() == 1

    ids = process_recorder.insert_events([_event(c, 1), _event(a, 2)], tracking=Tracking("up", 6))
    assert ids == [3, 4]  # sequence 2 holds the first tracking record, 5 the new one
    assert process_recorder.max_tracking_id("up") == 6


def test_racing_process_recorders_record_each_tracking_id_once(nats_server: NatsServer) -> None:
    """Two processes (own connections) race to process the same upstream notifications: the
    server's subject-sequence check lets exactly one record each, events and tracking together."""
    factories = [Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "race"}) for _ in range(2)]
    won: list[list[int]] = [[], []]
    errors: list[BaseException] = []  # a thread's exception is only logged: keep it
    start = threading.Barrier(2)

    def worker(n: int) -> None:
        recorder = factories[n].process_recorder()
        start.wait()
        for notification_id in range(1, 21):
            try:
                recorder.insert_events(
                    [_event(uuid.uuid4(), 1)], tracking=Tracking("up", notification_id)
                )
            except IntegrityError:
                continue
            except BaseException as e:  # anything but the lost race fails the test
                errors.append(e)
                raise
            won[n].append(notification_id)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        recorder = factories[0].process_recorder()
        assert errors == []
        assert sorted(won[0] + won[1]) == list(range(1, 21))  # each by one, never both
        assert recorder.max_tracking_id("up") == 20
        assert len(recorder.select_notifications(1, 100)) == len(won[0]) + len(won[1])
    finally:
        for f in factories:
            f.close()


class Counted(ProcessApplication[UUID]):
    """Counts the dogs registered upstream: its events and tracking go in one batch."""

    def policy(self, domain_event: Any, processing_event: Any) -> None:
        if isinstance(domain_event, Dog.Registered):
            tally = Tally(domain_event.name)
            processing_event.collect_events(tally)


class Tally(Aggregate):
    def __init__(self, name: str) -> None:
        self.name = name


def test_process_application_system(env: dict[str, str]) -> None:
    system = System(pipes=[[DogSchool, Counted]])
    runner: SingleThreadedRunner[UUID] = SingleThreadedRunner(
        system, env={"DOGSCHOOL_NATS_STREAM": "school", "COUNTED_NATS_STREAM": "counted"}
    )
    runner.start()
    try:
        school = runner.get(DogSchool)
        counted = runner.get(Counted)
        school.register_dog("Fido")
        school.register_dog("Rex")
        assert counted.recorder.max_tracking_id("DogSchool") == 2
        names = [
            counted.mapper.to_domain_event(n).name for n in counted.notification_log.select(1, 10)
        ]
        assert names == ["Fido", "Rex"]
    finally:
        runner.stop()


def test_event_sourced_projection_follows_live(env: dict[str, str]) -> None:
    """The library's subscribe() path: a projection follows the application as it writes."""
    with EventSourcedProjectionRunner(
        application_class=Application,
        projection_class=Counters,
        env={"APPLICATION_NATS_STREAM": "app", "COUNTERS_NATS_STREAM": "counters"},
    ) as runner:
        for expected in (1, 2, 3):
            recordings = runner.app.save(Aggregate())
            runner.wait(recordings[-1].notification.id, timeout=10)
            assert runner.projection.get_count(Aggregate.Created) == expected


def test_originator_id_tokens_are_reversible_subject_tokens() -> None:
    for value in (uuid.uuid4(), "a.b *>", "", "ü" * 40, "0" * 32):
        token = id_token(value)
        assert token_id(token) == value and type(token_id(token)) is type(value)
        assert all(c.isalnum() or c in "-_" for c in token)


async def test_sync_call_from_a_running_event_loop_is_refused(nats_server: NatsServer) -> None:
    factory = Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "loop"})
    try:
        with pytest.raises(RuntimeError, match=r"asyncio\.to_thread"):
            factory.application_recorder()  # the first connects: a blocking call
        recorder = await asyncio.to_thread(factory.application_recorder)
        with pytest.raises(RuntimeError, match=r"asyncio\.to_thread"):
            recorder.max_notification_id()
        assert await asyncio.to_thread(recorder.max_notification_id) is None

        # Nor may the private loop's own thread wait for itself.
        async def inside() -> None:
            recorder.max_notification_id()

        with pytest.raises(RuntimeError, match="deadlock"):
            factory.datastore.submit(inside()).result(timeout=10)
    finally:
        await asyncio.to_thread(factory.close)


def test_configuration_errors_name_the_setting(nats_server: NatsServer) -> None:
    with pytest.raises(OSError, match="NATS_STREAM"):
        Factory({"NATS_URL": nats_server.url})
    with pytest.raises(ValueError, match="NATS_STREAM"):
        Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "a.b"})
    unreachable = Factory(
        {
            "NATS_URL": f"nats://127.0.0.1:{free_port()}",
            "NATS_STREAM": "x",
            "NATS_CONNECT_TIMEOUT": "0.5",
        }
    )
    with pytest.raises(OperationalError, match="NATS_URL"):
        unreachable.application_recorder()  # the first recorder connects
    with pytest.raises(ValueError, match="NATS_CONNECT_TIMEOUT"):
        Factory({"NATS_STREAM": "x", "NATS_CONNECT_TIMEOUT": "soon"})


def test_close_ends_the_private_loop(nats_server: NatsServer) -> None:
    before = {t.name for t in threading.enumerate()}
    factory = Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "closing"})
    factory.application_recorder()
    assert "eventsourcing-jetstream-closing" in {t.name for t in threading.enumerate()} - before
    factory.close()
    assert "eventsourcing-jetstream-closing" not in {t.name for t in threading.enumerate()}
    with pytest.raises(RuntimeError, match="closed"):
        factory.application_recorder().max_notification_id()


def test_a_factory_used_for_its_mapper_alone_opens_nothing(nats_server: NatsServer) -> None:
    """The library's ProcessApplication.follow makes a factory for the leader's mapper and never
    closes it: each left a connection, a thread and a copy of the stream behind (a test's
    leaked thread kept reconnecting to its stopped server for the rest of the CI run)."""
    before = set(threading.enumerate())
    system = System(pipes=[[DogSchool, Counted]])
    env = {"PERSISTENCE_MODULE": "eventstore:Factory", "NATS_URL": nats_server.url}
    runner: SingleThreadedRunner[UUID] = SingleThreadedRunner(
        system, env={**env, "DOGSCHOOL_NATS_STREAM": "lead", "COUNTED_NATS_STREAM": "follow"}
    )
    runner.start()
    try:
        runner.get(DogSchool).register_dog("Fido")
        assert runner.get(Counted).recorder.max_tracking_id("DogSchool") == 1
    finally:
        runner.stop()
    left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert left == [], left
    factory = Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "unused"})
    factory.close()  # never opened: nothing to close, and closed for good
    with pytest.raises(RuntimeError, match="closed"):
        factory.application_recorder()


def test_an_application_never_closed_exits_quietly(nats_server: NatsServer) -> None:
    """Its __del__ comes at interpreter exit, when the private loop's thread may be gone: it
    printed "Exception ignored in Application.__del__ ... Cannot close a running event loop"."""
    script = (
        "import sys; from eventsourcing.application import Application;"
        " from eventsourcing.domain import Aggregate;"
        " app = Application(env={'PERSISTENCE_MODULE': 'eventstore:Factory',"
        " 'NATS_URL': sys.argv[1], 'NATS_STREAM': 'exiting'}); app.save(Aggregate())"
    )
    root = Path(__file__).parents[2]
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", script, nats_server.url],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (done.returncode, done.stderr) == (0, "")
    factory = Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "exiting"})
    try:
        assert factory.application_recorder().max_notification_id() == 2
    finally:
        factory.close()


def test_close_on_the_private_loop_itself_ends_it(nats_server: NatsServer) -> None:
    """A GC can drop the last reference to an application on any thread, the loop's too."""
    factory = Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "closing"})
    datastore = factory.datastore  # opened
    datastore._loop.loop.call_soon_threadsafe(factory.close)
    deadline = time.monotonic() + 10
    while "eventsourcing-jetstream-closing" in {t.name for t in threading.enumerate()}:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert datastore._loop.loop.is_closed()
    factory.close()  # again, from here: nothing left to do


async def test_events_are_plain_jetstream_messages(env: dict[str, str]) -> None:
    """Other services read what the library wrote without the library: subject, headers, data."""
    school = await asyncio.to_thread(DogSchool)
    try:
        dog_id = await asyncio.to_thread(school.register_dog, "Fido")
    finally:
        await asyncio.to_thread(school.close)
    nc = await connect(env["NATS_URL"])
    try:
        msg = await nc.jetstream().get_last_msg("dogs", f"es.dogs.events.{id_token(dog_id)}")
        assert msg.seq == 1
        assert msg.headers is not None and msg.headers["Es-Version"] == "1"
        assert msg.headers["Es-Topic"].endswith("Dog.Registered")
        assert b"Fido" in (msg.data or b"")
    finally:
        await nc.close()


def test_select_notifications_pages_past_other_topics_and_stops(nats_server: NatsServer) -> None:
    """Bounded reads: a sparse topic is found across pages; start, stop and limit hold."""
    factory = Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "pages"})
    try:
        recorder = factory.application_recorder()
        dog = uuid.uuid4()
        events = [
            StoredEvent(dog, v, "rare" if v % 300 == 0 else "common", b"{}") for v in range(1, 901)
        ]
        for start in range(0, 900, 450):
            recorder.insert_events(events[start : start + 450])
        factory.aggregate_recorder("snapshots").insert_events([StoredEvent(dog, 1, "rare", b"")])
        rare = recorder.select_notifications(None, 10, topics=["rare"])
        assert [n.id for n in rare] == [300, 600, 900]  # the snapshot (901) is no notification
        assert [n.id for n in recorder.select_notifications(None, 2, topics=["rare"])] == [300, 600]
        assert [n.id for n in recorder.select_notifications(300, 2, topics=["rare"])] == [300, 600]
        after = recorder.select_notifications(300, 5, topics=["rare"], inclusive_of_start=False)
        assert [n.id for n in after] == [600, 900]
        assert [n.id for n in recorder.select_notifications(1, 10, stop=899, topics=["rare"])] == [
            300,
            600,
        ]
        assert [n.id for n in recorder.select_notifications(895, 10)] == list(range(895, 901))
        assert [n.id for n in recorder.select_notifications(5, 3, stop=6)] == [5, 6]
        assert recorder.select_notifications(7, 3, stop=6) == []
        assert recorder.select_notifications(1, 0) == []
        assert recorder.max_notification_id() == 900
    finally:
        factory.close()
