"""A poison message on an eventsourcing stream's subjects stops nothing (issue 11): published
raw with stock nats-py, it is skipped by every reader, logged once and listed in the
recorders' ``quarantined``, and applications and their followers go on."""

from __future__ import annotations

import asyncio
import logging
import uuid
from uuid import UUID

import nats
import pytest
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import ApplicationRecorder, IntegrityError, StoredEvent, Tracking
from eventsourcing.projection import EventSourcedProjectionRunner
from eventsourcing.system import SingleThreadedRunner, System
from eventsourcing.tests.projection import Counters

from eventstore import Factory
from eventstore.persistence import id_token
from services.stack.natsserver import NatsServer
from tests.eventstore.test_persistence_app import Counted, DogSchool, Tally


def publish_raw(
    url: str, stream: str, *messages: tuple[str, bytes, dict[str, str] | None]
) -> list[int]:
    """Publish straight to JetStream, as any user allowed on the subjects could."""

    async def go() -> list[int]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            return [
                (await js.publish(subject, data, headers=headers, stream=stream)).seq
                for subject, data, headers in messages
            ]
        finally:
            await nc.close()

    return asyncio.run(go())


def poison_for(stream: str, aggregate: UUID) -> list[tuple[str, bytes, dict[str, str] | None]]:
    own = f"es.{stream}.events.{id_token(aggregate)}"
    return [
        (own, b"\x00garbage", None),  # no headers at all
        (own, b"{}", {"Es-Version": "two", "Es-Topic": "x:Y"}),  # the aggregate's last message
        (f"es.{stream}.events.{id_token(uuid.uuid4())}", b"{}", {"Es-Topic": "x:Y"}),
        (f"es.{stream}.events.not-a-token", b"{}", {"Es-Version": "1", "Es-Topic": "x:Y"}),
        (f"es.{stream}.events.a.b.c", b"{}", {"Es-Version": "1", "Es-Topic": "x:Y"}),
        (f"es.{stream}.events.snot%valid", b"{}", {"Es-Version": "1", "Es-Topic": "x:Y"}),
        (own, b"{}", {"Es-Version": "9"}),  # no topic
    ]


def test_application_reads_past_poison(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    school = DogSchool(env={"PERSISTENCE_MODULE": "eventstore:Factory",
                            "NATS_URL": nats_server.url, "NATS_STREAM": "dogs"})  # fmt: skip
    try:
        dog = school.register_dog("Fido")
        school.add_trick(dog, "sit")
        poison = publish_raw(nats_server.url, "dogs", *poison_for("dogs", dog))
        assert poison == list(range(3, 10))
        recorder = school.recorder
        caplog.set_level(logging.WARNING, "eventstore.persistence")

        # The aggregate loads and takes new events although poison is its last message.
        assert school.get_dog(dog) == {"name": "Fido", "tricks": ("sit",)}
        school.add_trick(dog, "roll over")
        assert school.get_dog(dog) == {"name": "Fido", "tricks": ("sit", "roll over")}
        versions = [e.originator_version for e in recorder.select_events(dog)]
        assert versions == [1, 2, 3]
        assert [e.originator_version for e in recorder.select_events(dog, desc=True, limit=1)] == [
            3
        ]

        # Notifications: the valid ones, in order; poison leaves a gap by design.
        ids = [n.id for n in recorder.select_notifications(None, 100)]
        assert ids == [1, 2, 10]
        assert [n.id for n in recorder.select_notifications(2, 2)] == [2, 10]
        assert [n.id for n in recorder.select_notifications(3, 5, stop=9)] == []
        assert [n.id for n in school.notification_log.select(1, 10)] == [1, 2, 10]

        # Poison at the head: the highest VALID id.
        publish_raw(nats_server.url, "dogs", (f"es.dogs.events.{id_token(dog)}", b"", None))
        assert recorder.max_notification_id() == 10
        assert [n.id for n in recorder.select_notifications(None, 100)] == [1, 2, 10]

        listed = recorder.quarantined  # type: ignore[attr-defined]
        assert [q.seq for q in listed] == [*poison, 11]
        reasons = {q.seq: q.reason for q in listed}
        assert reasons[3] == "no Es-Version header"
        assert "'two' is not an integer" in reasons[4]
        assert reasons[9] == "no Es-Topic header"
        assert "not es.<stream>.<kind>.<id token>" in reasons[7]
        assert "not an originator id token" in reasons[6] and "not an originator" in reasons[8]
        assert listed[0].subject == f"es.dogs.events.{id_token(dog)}"
        # Logged once each, though every read above met them again.
        logged = [r.getMessage() for r in caplog.records if "no eventsourcing record" in r.message]
        for seq in (*poison, 11):
            assert sum(f"message {seq} on" in m for m in logged) == 1, (seq, logged)
    finally:
        school.close()


def test_process_application_and_projection_keep_following(nats_server: NatsServer) -> None:
    """A follower pulling notifications (SingleThreadedRunner) and one subscribed live
    (EventSourcedProjectionRunner) go on past poison upstream and on their own tracking."""
    env = {"PERSISTENCE_MODULE": "eventstore:Factory", "NATS_URL": nats_server.url}
    system = System(pipes=[[DogSchool, Counted]])
    runner: SingleThreadedRunner[UUID] = SingleThreadedRunner(
        system, env={**env, "DOGSCHOOL_NATS_STREAM": "school", "COUNTED_NATS_STREAM": "counted"}
    )
    runner.start()
    try:
        school, counted = runner.get(DogSchool), runner.get(Counted)
        school.register_dog("Fido")
        publish_raw(nats_server.url, "school", *poison_for("school", uuid.uuid4()))
        # Poison on the follower's own tracking subject too.
        tracking = f"es.counted.tracking.{id_token('DogSchool')}"
        publish_raw(nats_server.url, "counted", (tracking, b"", {"Es-Tracking-Id": "many"}))
        school.register_dog("Rex")
        school.register_dog("Lassie")
        assert counted.recorder.max_tracking_id("DogSchool") == 10  # Lassie, after 7 poison
        names = [
            counted.mapper.to_domain_event(n).name for n in counted.notification_log.select(1, 10)
        ]
        assert names == ["Fido", "Rex", "Lassie"]
        assert all(isinstance(counted.mapper.to_domain_event(n), Tally.Created)
                   for n in counted.notification_log.select(1, 10))  # fmt: skip
        assert len(counted.recorder.quarantined) == 1  # type: ignore[attr-defined]
    finally:
        runner.stop()

    with EventSourcedProjectionRunner(
        application_class=DogSchool,
        projection_class=Counters,
        env={**env, "DOGSCHOOL_NATS_STREAM": "school", "COUNTERS_NATS_STREAM": "counters"},
    ) as projection:
        publish_raw(nats_server.url, "school", *poison_for("school", uuid.uuid4()))
        recordings = projection.app.save(Aggregate())
        projection.wait(recordings[-1].notification.id, timeout=10)
        assert projection.projection.get_count(Aggregate.Created) == 1
        recordings = projection.app.save(Aggregate())
        projection.wait(recordings[-1].notification.id, timeout=10)
        assert projection.projection.get_count(Aggregate.Created) == 2


def test_recorders_skip_poison_in_tracking_and_snapshots(nats_server: NatsServer) -> None:
    factory = Factory({"NATS_URL": nats_server.url, "NATS_STREAM": "rec"})
    try:
        recorder = factory.process_recorder()
        a = uuid.uuid4()
        recorder.insert_events([StoredEvent(a, 1, "t", b"")], tracking=Tracking("up", 5))
        publish_raw(
            nats_server.url,
            "rec",
            (f"es.rec.tracking.{id_token('up')}", b"", None),
            (f"es.rec.snapshots.{id_token(a)}", b"junk", {"Es-Version": ""}),
        )
        assert recorder.max_tracking_id("up") == 5
        with pytest.raises(IntegrityError, match="not greater than the recorded 5"):
            recorder.insert_events([], tracking=Tracking("up", 5))
        recorder.insert_events([StoredEvent(a, 2, "t", b"")], tracking=Tracking("up", 6))
        assert recorder.max_tracking_id("up") == 6
        snapshots = factory.aggregate_recorder("snapshots")
        assert snapshots.select_events(a, desc=True, limit=1) == []
        snapshots.insert_events([StoredEvent(a, 2, "t", b"s")])
        assert [s.state for s in snapshots.select_events(a)] == [b"s"]
        # A well-formed event out of version order on an aggregate's subject.
        publish_raw(
            nats_server.url,
            "rec",
            (f"es.rec.events.{id_token(a)}", b"old", {"Es-Version": "1", "Es-Topic": "t"}),
        )
        recorder.catch_up()  # another process's append: reads see it once the copy has it
        assert [e.originator_version for e in recorder.select_events(a)] == [1, 2]
        assert [q.seq for q in recorder.quarantined] == [3, 4, 8]
        assert recorder.quarantined[-1].reason == "version 1 is not after 2"
        assert recorder.quarantined == snapshots.quarantined  # type: ignore[attr-defined]
    finally:
        factory.close()


@pytest.mark.parametrize("copy_mb", ["256", "0"])
def test_a_version_out_of_order_is_no_notification_either(
    nats_server: NatsServer, copy_mb: str
) -> None:
    """Copies of an aggregate's event published on its subject with a version not after its
    last one (2 again, -5, 1) were skipped by select_events and quarantined, yet notifications
    (from the local copy and from the server alike) and subscriptions returned them."""
    env = {"NATS_URL": nats_server.url, "NATS_STREAM": "ver", "NATS_LOCAL_COPY_MB": copy_mb}
    factory = Factory(env)
    try:
        recorder = factory.application_recorder()
        dog, other = uuid.uuid4(), uuid.uuid4()
        recorder.insert_events([StoredEvent(dog, 1, "t", b"1"), StoredEvent(dog, 2, "t", b"2")])
        own = f"es.ver.events.{id_token(dog)}"
        copies = [(own, b"2", {"Es-Version": v, "Es-Topic": "t"}) for v in ("2", "-5", "1")]
        assert publish_raw(nats_server.url, "ver", *copies) == [3, 4, 5]
        recorder.catch_up()
        assert recorder.insert_events(
            [StoredEvent(dog, 3, "t", b"3"), StoredEvent(other, 1, "u", b"o")]
        ) == [6, 7]
        # At the head too: the aggregate's last message, yet not its last event.
        publish_raw(nats_server.url, "ver", (own, b"x", {"Es-Version": "1", "Es-Topic": "t"}))

        assert recorder.max_notification_id() == 7
        fresh = Factory(env)  # knows nothing of the stream yet
        try:
            for reader in (recorder, fresh.application_recorder()):
                assert_poison_skipped(reader, dog)
        finally:
            fresh.close()
        recorder.insert_events([StoredEvent(dog, 4, "t", b"4")])
        with recorder.subscribe(gt=7) as subscription:
            assert next(subscription).originator_version == 4
    finally:
        factory.close()


def assert_poison_skipped(reader: ApplicationRecorder, dog: UUID) -> None:
    assert [n.id for n in reader.select_notifications(None, 100)] == [1, 2, 6, 7]
    assert [n.id for n in reader.select_notifications(3, 1)] == [6]
    assert [n.id for n in reader.select_notifications(4, 10, stop=6)] == [6]
    assert [n.id for n in reader.select_notifications(1, 10, topics=["t"])] == [1, 2, 6]
    assert reader.max_notification_id() == 7
    assert [e.originator_version for e in reader.select_events(dog)] == [1, 2, 3]
    assert [e.state for e in reader.select_events(dog, desc=True, limit=1)] == [b"3"]
    with pytest.raises(IntegrityError):  # not stored behind the poison, to be skipped
        reader.insert_events([StoredEvent(dog, 3, "t", b"again")])
    with reader.subscribe(gt=None) as subscription:
        assert [next(subscription).id for _ in range(4)] == [1, 2, 6, 7]
    assert [q.seq for q in reader.quarantined] == [3, 4, 5, 8]  # type: ignore[attr-defined]
