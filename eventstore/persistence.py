"""A persistence module for the ``eventsourcing`` library on JetStream.

Any plain ``eventsourcing`` Application runs on it unchanged with::

    PERSISTENCE_MODULE=eventstore:Factory   (or ``eventstore.persistence``)
    NATS_URL=nats://127.0.0.1:4222
    NATS_STREAM=<stream name>                         (created if missing)

Layout of one stream ``S``, which binds ``es.S.>`` (its own subject space, so streams never
see each other's events)::

    es.S.events.<id token>       one subject per aggregate; notification id = stream sequence
    es.S.snapshots.<id token>    snapshots (not notifications)
    es.S.tracking.<app token>    one message per recorded Tracking

The library is synchronous and nats-py is asyncio: each Factory runs one private event loop in a
daemon thread with its own NATS connection; appends and reads of the server are coroutines
submitted to it. A synchronous call therefore never runs on (or blocks) the services' loop;
calling from a thread that runs an event loop is refused with a clear error instead of stalling
that loop.

**Reads come from a local copy** of the stream (``persistence_copy``), followed in that loop and
answered in the caller's thread: no round trip, no hop into the loop.  A read sees every append
of this process acknowledged before it started; other processes' appends once the copy has them
(within a millisecond or so), and at once after ``catch_up()``, which an aggregate that is not
found, ``max_notification_id`` and ``max_tracking_id`` do themselves.  An append is conditional
on each subject's last sequence as the copy holds it, so it costs one round trip; a stale copy
costs a re-read from the server, never a wrong write.  Streams over ``NATS_LOCAL_COPY_MB`` are
read from the server.

**Poison messages.** Anyone allowed to publish on the stream's subjects can put there a message
that is no record of this module (no or bad ``Es-Version``/``Es-Topic``/``Es-Tracking-Id``
headers, a subject that is not ``es.S.<kind>.<id token>``, garbage; in an aggregate's history
also a version not after the one before it).  Every reader
(``select_events``, ``select_notifications``, ``subscribe``, ``max_notification_id``, the
version and tracking checks of an append, ``max_tracking_id``) skips it and goes on; it is
logged once per factory and listed in the recorders' ``quarantined`` (seq, subject, reason);
the local copy meets every message of the stream, so with it every poison message is listed.
A skipped message is a gap in the notification ids by design: ids are stream sequences, which
already skip snapshots and tracking records, so readers see the valid notifications in order
and never one they missed.  A version out of order is no notification either: the local copy
decides it as it applies the stream, the reads from the server with ``persistence_versions``
(which reads an aggregate's history only where its records do not say what came before).
A message with well-formed headers whose state the application cannot decode is the
application's to handle: its mapper raises as it would on any store.

This module is the Factory; the recorders are persistence_recorders, the connection they share
(private loop, datastore, the library's errors) persistence_datastore.
"""

from __future__ import annotations

import threading

from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    InfrastructureFactory,
    ProcessRecorder,
)
from eventsourcing.utils import Environment, EnvType, resolve_topic

from domain.subjects import check_token
from eventstore.persistence_datastore import (
    CONNECT_TIMEOUT,
    LOCAL_COPY_MB,
    MAYBE_SAVED,
    NOT_SAVED,
    JetStreamDatastore,
)
from eventstore.persistence_recorders import (
    JetStreamAggregateRecorder,
    JetStreamApplicationRecorder,
    JetStreamProcessRecorder,
    JetStreamSubscription,
    JetStreamTrackingRecorder,
)
from eventstore.persistence_records import (
    Quarantined,
    id_token,
    token_id,
)

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

__all__ = [
    "MAYBE_SAVED",
    "NOT_SAVED",
    "Factory",
    "JetStreamAggregateRecorder",
    "JetStreamApplicationRecorder",
    "JetStreamDatastore",
    "JetStreamProcessRecorder",
    "JetStreamSubscription",
    "JetStreamTrackingRecorder",
    "Quarantined",
    "id_token",
    "token_id",
]


class Factory(InfrastructureFactory[JetStreamTrackingRecorder]):
    """``PERSISTENCE_MODULE=eventstore:Factory``; reads NATS_URL, NATS_STREAM,
    NATS_CONNECT_TIMEOUT (seconds, default 10) and NATS_LOCAL_COPY_MB (the most memory the
    stream's local copy takes, default 256; 0: no copy, every read goes to the server), each
    maybe prefixed with the upper-cased application name as the library does
    (``DOGSCHOOL_NATS_STREAM``)."""

    NATS_URL = "NATS_URL"
    NATS_STREAM = "NATS_STREAM"
    NATS_CONNECT_TIMEOUT = "NATS_CONNECT_TIMEOUT"
    NATS_LOCAL_COPY_MB = "NATS_LOCAL_COPY_MB"

    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        stream = self.env.get(self.NATS_STREAM)
        if not stream:
            raise OSError(
                f"{self.NATS_STREAM} is not set: set it to the JetStream stream that holds this"
                " application's events (created if missing), e.g. NATS_STREAM=orders"
            )
        timeout = self.env.get(self.NATS_CONNECT_TIMEOUT, str(CONNECT_TIMEOUT))
        try:
            connect_timeout = float(timeout)
        except ValueError:
            raise ValueError(
                f"{self.NATS_CONNECT_TIMEOUT} must be a number of seconds, got {timeout!r}"
            ) from None
        copy_mb = self.env.get(self.NATS_LOCAL_COPY_MB, str(LOCAL_COPY_MB))
        try:
            local_copy_bytes = int(float(copy_mb) * (1 << 20))
        except ValueError:
            local_copy_bytes = -1
        if local_copy_bytes < 0:
            raise ValueError(
                f"{self.NATS_LOCAL_COPY_MB} must be a number of megabytes >= 0 (0: no local"
                f" copy), got {copy_mb!r}"
            )
        self._opening = (
            self.env.get(self.NATS_URL, DEFAULT_NATS_URL),
            check_token(stream, self.NATS_STREAM),
            connect_timeout,
            local_copy_bytes,
        )
        self._datastore: JetStreamDatastore | None = None
        self._closed = False
        self._lock = threading.Lock()

    @property
    def datastore(self) -> JetStreamDatastore:
        """The stream's connection, opened at the first recorder: the library makes factories
        it only takes a mapper from (``ProcessApplication.follow``) and never closes, and each
        would hold a connection, a thread and a copy of the stream for the process's life."""
        with self._lock:  # held while connecting: a close() meanwhile waits for it
            if self._closed:
                raise RuntimeError(
                    "the persistence factory is closed; construct a new Application/Factory"
                )
            if self._datastore is None:
                self._datastore = JetStreamDatastore(*self._opening)
            return self._datastore

    def aggregate_recorder(self, purpose: str = "events") -> AggregateRecorder:
        return JetStreamAggregateRecorder(self.datastore, purpose=purpose)

    def application_recorder(self) -> ApplicationRecorder:
        return JetStreamApplicationRecorder(self.datastore)

    def tracking_recorder(
        self, tracking_recorder_class: type[JetStreamTrackingRecorder] | None = None
    ) -> JetStreamTrackingRecorder:
        if tracking_recorder_class is None:
            topic = self.env.get(self.TRACKING_RECORDER_TOPIC)
            tracking_recorder_class = resolve_topic(topic) if topic else JetStreamTrackingRecorder
        assert tracking_recorder_class is not None
        if not issubclass(tracking_recorder_class, JetStreamTrackingRecorder):
            raise TypeError(
                f"{self.TRACKING_RECORDER_TOPIC} must name a JetStreamTrackingRecorder subclass,"
                f" got {tracking_recorder_class!r}"
            )
        return tracking_recorder_class(self.datastore)

    def process_recorder(self) -> ProcessRecorder:
        return JetStreamProcessRecorder(self.datastore)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            datastore = self._datastore
        if datastore is not None:
            datastore.close()
