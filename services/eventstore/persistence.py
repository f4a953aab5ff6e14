"""A persistence module for the ``eventsourcing`` library on JetStream.

Any plain ``eventsourcing`` Application runs on it unchanged with::

    PERSISTENCE_MODULE=services.eventstore:Factory   (or ``services.eventstore.persistence``)
    NATS_URL=nats://127.0.0.1:4222
    NATS_STREAM=<stream name>                         (created if missing)

Layout of one stream ``S`` (its own subject space, so streams never see each other's events)::

    es.S.events.<id token>       one subject per aggregate; notification id = stream sequence
    es.S.snapshots.<id token>    snapshots (not notifications)
    es.S.tracking.<app token>    one message per recorded Tracking

The library is synchronous and nats-py is asyncio: each Factory runs one private event loop in a
daemon thread with its own NATS connection, and every recorder call is a coroutine submitted to
it. A synchronous call therefore never runs on (or blocks) the services' loop; calling from a
thread that runs an event loop is refused with a clear error instead of stalling that loop.

**Poison messages.** Anyone allowed to publish on the stream's subjects can put there a message
that is no record of this module (no or bad ``Es-Version``/``Es-Topic``/``Es-Tracking-Id``
headers, a subject that is not ``es.S.<kind>.<id token>``, garbage; in an aggregate's history
also a version not after the one before it).  Every reader
(``select_events``, ``select_notifications``, ``subscribe``, ``max_notification_id``, the
version and tracking checks of an append, ``max_tracking_id``) skips it and goes on; it is
logged once per factory and listed in the recorders' ``quarantined`` (seq, subject, reason).
A skipped message is a gap in the notification ids by design: ids are stream sequences, which
already skip snapshots and tracking records, so readers see the valid notifications in order
and never one they missed.  A message with well-formed headers whose state the application
cannot decode is the application's to handle: its mapper raises as it would on any store.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    InfrastructureFactory,
    IntegrityError,
    Notification,
    OperationalError,
    ProcessRecorder,
    StoredEvent,
    Subscription,
    Tracking,
    TrackingRecorder,
)
from eventsourcing.utils import Environment, EnvType, resolve_topic

from domain.subjects import check_token
from services.eventstore.store import PAGE, ConcurrencyError, EventStore, Message, Recorded, Write
from services.transport.client import Client, connect

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
CONNECT_TIMEOUT = 10.0  # default seconds to reach NATS_URL when a Factory is constructed
CALL_TIMEOUT = 60.0  # seconds a synchronous call waits for the private loop
MAX_CONFLICT_RETRIES = 20  # re-reads after a subject moved under us without a real conflict
MAX_TOPIC_PAGE = 1000  # most events read at once while looking for notifications of some topics
MAX_QUARANTINED = 10_000  # poison messages listed (and logged); past that only counted

TOPIC = "Es-Topic"
VERSION = "Es-Version"
TRACKING_ID = "Es-Tracking-Id"


def id_token(originator_id: UUID | str) -> str:
    """A subject token for an originator id, reversibly and keeping its type:
    ``u<hex>`` for a UUID, ``s<base64url without padding>`` for a string."""
    if isinstance(originator_id, UUID):
        return "u" + originator_id.hex
    if isinstance(originator_id, str):
        return "s" + base64.urlsafe_b64encode(originator_id.encode()).rstrip(b"=").decode()
    raise TypeError(f"originator_id must be a UUID or a str, got {type(originator_id).__name__}")


def token_id(token: str) -> UUID | str:
    """The originator id a token of :func:`id_token` stands for."""
    kind, body = token[:1], token[1:]
    if kind == "u":
        return UUID(hex=body)
    if kind == "s":
        return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    raise ValueError(f"not an originator id token: {token!r}")


@dataclass(frozen=True)
class Quarantined:
    """A message on the stream's subjects that is no record of this module: skipped."""

    seq: int
    subject: str
    reason: str


class _PrivateLoop:
    """An asyncio loop in a daemon thread: synchronous code submits coroutines to it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._in_flight: set[Future[Any]] = set()
        self._lock = threading.Lock()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        with self._lock:
            self._in_flight.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._in_flight.discard(future)

    def cancel_in_flight(self) -> None:
        """Cancel every call and subscription still running (the factory is closing)."""
        with self._lock:
            in_flight = list(self._in_flight)
        for future in in_flight:
            future.cancel()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT) -> T:
        """Run ``coro`` on the private loop and wait for its result in this thread."""
        refusal = self._refusal()
        if refusal:
            coro.close()
            raise RuntimeError(refusal)
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise OperationalError(
                f"JetStream did not answer within {timeout}s; check that nats-server is up"
            ) from None
        except CancelledError:
            raise OperationalError(
                "the persistence factory was closed while this call was running"
            ) from None

    def _refusal(self) -> str | None:
        if threading.get_ident() == self._thread.ident:
            return (
                "a synchronous eventsourcing recorder method was called on its own private "
                "event loop thread, which would deadlock; call it from another thread"
            )
        if not self._thread.is_alive():
            return "the persistence factory is closed; construct a new Application/Factory"
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return None
        return (
            "a synchronous eventsourcing recorder method was called from a running event loop,"
            " which it would block; run it in a worker thread, e.g."
            " `await asyncio.to_thread(app.save, aggregate)`"
        )

    def close(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        if not self.loop.is_closed():
            self.loop.close()


class JetStreamDatastore:
    """One stream, one NATS connection and the private loop that owns it."""

    def __init__(self, url: str, stream: str, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self.stream = check_token(stream, "NATS_STREAM")
        self.prefix = f"es.{stream}"
        self.events_filter = f"{self.prefix}.events.>"
        self._loop = _PrivateLoop(name=f"eventsourcing-jetstream-{stream}")
        self._nc: Client | None = None
        self._quarantined: dict[int, Quarantined] = {}  # seq -> why; also "logged already"
        self.quarantined_count = 0  # distinct poison messages met, listed or not
        self._quarantine_lock = threading.Lock()  # read from callers' threads
        try:
            self.store: EventStore = self._loop.run(self._open())
        except BaseException:
            self._loop.close()
            raise

    async def _open(self) -> EventStore:
        try:
            # nats-py keeps retrying a first connect for minutes: bound it, then say why.
            self._nc = await asyncio.wait_for(
                connect(
                    self.url,
                    name=f"eventsourcing-{self.stream}",
                    connect_timeout=2,
                    error_cb=self._on_nats_error,
                ),
                self.connect_timeout,
            )
        except Exception as e:
            raise OperationalError(
                f"cannot connect to NATS_URL={self.url} within {self.connect_timeout}s ({e!r}):"
                " start nats-server or fix NATS_URL"
            ) from e
        store = EventStore(self._nc, self.stream, [f"{self.prefix}.>"])
        await store.ensure_stream()
        return store

    async def _on_nats_error(self, error: Exception) -> None:
        log.warning("NATS connection of stream %s: %r", self.stream, error)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    def quarantine(self, record: Recorded, reason: str) -> None:
        """Note a poison message; logged the first time only (readers meet it on every read)."""
        with self._quarantine_lock:
            if record.seq in self._quarantined:
                return
            self.quarantined_count += 1
            if len(self._quarantined) >= MAX_QUARANTINED:
                if self.quarantined_count == MAX_QUARANTINED + 1:
                    log.warning(
                        "stream %s: over %d poison messages; no longer listing them",
                        self.stream,
                        MAX_QUARANTINED,
                    )
                return
            self._quarantined[record.seq] = Quarantined(record.seq, record.subject, reason)
        log.warning(
            "stream %s: message %d on %s is no eventsourcing record (%s): skipped",
            self.stream,
            record.seq,
            record.subject[:200],
            reason,
        )

    @property
    def quarantined(self) -> list[Quarantined]:
        with self._quarantine_lock:
            return sorted(self._quarantined.values(), key=lambda q: q.seq)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return self._loop.submit(coro)

    def subject(self, kind: str, token: str) -> str:
        return f"{self.prefix}.{kind}.{token}"

    def close(self) -> None:
        # Calls still running (a reader thread, a subscription) would hold the connection
        # open: end them first. Every append waited for its ack, so nothing is left to flush.
        self._loop.cancel_in_flight()
        nc = self._nc
        if nc is not None and not nc.is_closed and self._loop.loop.is_running():
            with contextlib.suppress(Exception):  # closing anyway; the server may be gone
                self._loop.run(nc.close(), timeout=10)
        self._nc = None
        self._loop.close()


# Decoders of stored records: each raises ValueError, naming what is wrong, for a poison one.


def _int_header(record: Recorded, name: str) -> int:
    raw = record.headers.get(name)
    if raw is None:
        raise ValueError(f"no {name} header")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} {raw[:40]!r} is not an integer") from None


def _originator_id(record: Recorded) -> UUID | str:
    parts = record.subject.split(".")
    if len(parts) != 4:
        raise ValueError("the subject is not es.<stream>.<kind>.<id token>")
    try:
        originator_id = token_id(parts[3])
    except ValueError:  # base64 and UTF-8 errors are ValueErrors too
        originator_id = None
    # Only the token id_token() makes (base64 decoding skips stray characters).
    if originator_id is None or id_token(originator_id) != parts[3]:
        raise ValueError(f"{parts[3][:40]!r} is not an originator id token")
    return originator_id


def _topic(record: Recorded) -> str:
    topic = record.headers.get(TOPIC)
    if not topic:
        raise ValueError(f"no {TOPIC} header")
    return topic


def _stored_event(record: Recorded) -> StoredEvent:
    return StoredEvent(
        originator_id=_originator_id(record),
        originator_version=_int_header(record, VERSION),
        topic=_topic(record),
        state=record.data,
    )


def _notification(record: Recorded) -> Notification:
    return Notification(
        id=record.seq,
        originator_id=_originator_id(record),
        originator_version=_int_header(record, VERSION),
        topic=_topic(record),
        state=record.data,
    )


def _tracking_id(record: Recorded) -> int:
    return _int_header(record, TRACKING_ID)


class JetStreamRecorder:
    """Shared by all recorders: the atomic, version-checked append of events (and tracking)."""

    def __init__(self, datastore: JetStreamDatastore, purpose: str = "events") -> None:
        self.datastore = datastore
        self.kind = check_token(purpose, "purpose")

    def _tracking_subject(self, application_name: str) -> str:
        return self.datastore.subject("tracking", id_token(application_name))

    @property
    def quarantined(self) -> list[Quarantined]:
        """The poison messages this factory's readers skipped, in stream order."""
        return self.datastore.quarantined

    def _decode(self, record: Recorded, decode: Callable[[Recorded], T]) -> T | None:
        """``decode(record)``, or None for a poison message (quarantined)."""
        try:
            return decode(record)
        except ValueError as e:
            self.datastore.quarantine(record, str(e))
            return None

    async def _last_valid(
        self, subject: str, last: Recorded | None, decode: Callable[[Recorded], T]
    ) -> T | None:
        """The subject's last valid record, decoded; its whole history is read only when
        poison lies at its end."""
        if last is None:
            return None
        value = self._decode(last, decode)
        if value is not None:
            return value
        for record in reversed(await self.datastore.store.read_subject(subject)):
            value = self._decode(record, decode)
            if value is not None:
                return value
        return None

    async def _append(
        self, stored_events: Sequence[StoredEvent], tracking: Tracking | None
    ) -> list[int]:
        """Append all events (and the tracking record) in one atomic write, or nothing.

        Each aggregate's new versions must exceed its last recorded version; the write is
        conditional on each subject's last sequence, so a concurrent writer makes it fail
        (and we re-read: a real conflict then shows as IntegrityError)."""
        by_subject: dict[str, list[int]] = {}
        for index, event in enumerate(stored_events):
            subject = self.datastore.subject(self.kind, id_token(event.originator_id))
            by_subject.setdefault(subject, []).append(index)
        subjects = list(by_subject)
        if tracking is not None:
            subjects.append(self._tracking_subject(tracking.application_name))
        if not subjects:
            return []
        for _ in range(MAX_CONFLICT_RETRIES):
            lasts = await asyncio.gather(*(self.datastore.store.last(s) for s in subjects))
            # The versions to be after: the last VALID ones (poison is skipped), while the
            # write stays conditional on each subject's last message, poison or not.
            valid = await asyncio.gather(
                *(
                    self._last_valid(s, last, _stored_event)
                    for s, last in zip(by_subject, lasts, strict=False)
                )
            )
            writes = [
                self._event_write(
                    subject,
                    [stored_events[i] for i in indexes],
                    last,
                    event.originator_version if event else None,
                )
                for (subject, indexes), last, event in zip(
                    by_subject.items(), lasts, valid, strict=False
                )
            ]
            if tracking is not None:
                tracked = await self._last_valid(subjects[-1], lasts[-1], _tracking_id)
                writes.append(_tracking_write(subjects[-1], tracking, lasts[-1], tracked))
            try:
                seqs = await self.datastore.store.append(writes)
            except ConcurrencyError:
                continue  # someone wrote one of these subjects since we read it: check again
            notification_ids = [0] * len(stored_events)
            flat = iter(seqs)
            for indexes in by_subject.values():
                for i in indexes:
                    notification_ids[i] = next(flat)
            return notification_ids
        raise OperationalError(
            f"gave up after {MAX_CONFLICT_RETRIES} concurrent writes to {subjects}; retry later"
        )

    def _event_write(
        self, subject: str, events: list[StoredEvent], last: Recorded | None, previous: int | None
    ) -> Write:
        for event in events:
            if previous is not None and event.originator_version <= previous:
                raise IntegrityError(
                    f"version {event.originator_version} of {event.originator_id!r} is not after"
                    f" version {previous} (already recorded or repeated): reload and retry"
                )
            previous = event.originator_version
        messages = [
            Message(data=e.state, headers={TOPIC: e.topic, VERSION: str(e.originator_version)})
            for e in events
        ]
        return Write(subject, messages, expected_last_seq=last.seq if last else 0)


def _tracking_write(
    subject: str, tracking: Tracking, last: Recorded | None, tracked: int | None
) -> Write:
    if tracked is not None and tracking.notification_id <= tracked:
        raise IntegrityError(
            f"tracking id {tracking.notification_id} of {tracking.application_name!r} is not"
            f" greater than the recorded {tracked}"
        )
    message = Message(data=b"", headers={TRACKING_ID: str(tracking.notification_id)})
    return Write(subject, [message], expected_last_seq=last.seq if last else 0)


class JetStreamAggregateRecorder(JetStreamRecorder, AggregateRecorder):
    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        self.datastore.run(self._append(stored_events, None))
        return None

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        subject = self.datastore.subject(self.kind, id_token(originator_id))
        return self.datastore.run(self._select_events(subject, gt, lte, desc, limit))

    async def _select_events(
        self, subject: str, gt: int | None, lte: int | None, desc: bool, limit: int | None
    ) -> list[StoredEvent]:
        if desc and limit == 1 and lte is None:
            # The latest event or snapshot: what every repository.get() asks first.
            last = await self.datastore.store.last(subject)
            event = await self._last_valid(subject, last, _stored_event)
            return [event] if event and (gt is None or event.originator_version > gt) else []
        events: list[StoredEvent] = []
        previous: int | None = None
        for record in await self.datastore.store.read_subject(subject):
            event = self._decode(record, _stored_event)
            if event is None:
                continue
            version = event.originator_version
            if previous is not None and version <= previous:
                # Appends only ever add later versions: this one was published around them.
                self.datastore.quarantine(record, f"version {version} is not after {previous}")
                continue
            previous = version
            if (gt is None or version > gt) and (lte is None or version <= lte):
                events.append(event)
        if desc:
            events.reverse()
        return events if limit is None else events[:limit]


class JetStreamApplicationRecorder(JetStreamAggregateRecorder, ApplicationRecorder):
    def __init__(self, datastore: JetStreamDatastore) -> None:
        super().__init__(datastore, purpose="events")

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        return self.datastore.run(self._append(stored_events, kwargs.get("tracking")))

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        first = 1 if start is None else start if inclusive_of_start else start + 1
        return self.datastore.run(self._select_notifications(max(first, 1), limit, stop, topics))

    async def _select_notifications(
        self, first: int, limit: int, stop: int | None, topics: Iterable[str]
    ) -> list[Notification]:
        wanted = set(topics)
        found: list[Notification] = []
        store = self.datastore.store
        scale = 1  # with topics, skipped events call for more (and larger) pages
        while len(found) < limit and (stop is None or first <= stop):
            page = limit - len(found)
            if wanted:
                page = max(page, min(page * scale, MAX_TOPIC_PAGE))
                scale = min(scale * 2, MAX_TOPIC_PAGE)
            if stop is not None:
                page = min(page, stop - first + 1)  # no more sequences than that before stop
            records = await store.read(first, page, self.datastore.events_filter)
            for record in records:
                if stop is not None and record.seq > stop:
                    return found
                notification = self._decode(record, _notification)
                if notification is None or (wanted and notification.topic not in wanted):
                    continue
                found.append(notification)
                if len(found) >= limit:
                    return found
            if len(records) < page:
                return found  # the stream holds no more events (yet)
            first = records[-1].seq + 1
        return found

    def max_notification_id(self) -> int | None:
        return self.datastore.run(self._max_notification_id())

    async def _max_notification_id(self) -> int | None:
        """The last VALID notification's id: poison at the head is walked back over."""
        store, events = self.datastore.store, self.datastore.events_filter
        last = await store.last(events)
        if last is None or self._decode(last, _notification) is not None:
            return last.seq if last else None
        end = last.seq - 1
        while end >= 1:
            first = max(1, end - PAGE + 1)
            records = [r for r in await store.read(first, end - first + 1, events) if r.seq <= end]
            for record in reversed(records):
                if self._decode(record, _notification) is not None:
                    return record.seq
            end = first - 1
        return None

    def subscribe(
        self, gt: int | None = None, topics: Sequence[str] = ()
    ) -> Subscription[ApplicationRecorder]:
        return JetStreamSubscription(self, gt=gt, topics=topics)


async def _aclose(iterator: object) -> None:
    """Release a replay's consumer when we stop reading early."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


class JetStreamSubscription(Subscription[JetStreamApplicationRecorder]):
    """Notifications after ``gt``, then live ones as they are stored (a following replay on the
    private loop feeds a bounded queue that the iterating thread reads)."""

    def __init__(
        self,
        recorder: JetStreamApplicationRecorder,
        gt: int | None = None,
        topics: Sequence[str] = (),
    ) -> None:
        super().__init__(recorder=recorder, gt=gt, topics=topics)
        self._queue: queue.Queue[Notification | BaseException] = queue.Queue(maxsize=1000)
        self._follower = recorder.datastore.submit(self._follow())

    async def _follow(self) -> None:
        datastore = self._recorder.datastore
        wanted = set(self._topics)
        replay = datastore.store.replay(
            from_seq=(self._last_notification_id or 0) + 1,
            subject_filter=datastore.events_filter,
            follow=True,
        )
        try:
            async for record in replay:
                notification = self._recorder._decode(record, _notification)
                if notification is None or (wanted and notification.topic not in wanted):
                    continue
                await self._put(notification)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            await self._put(e)
        finally:
            await _aclose(replay)

    async def _put(self, item: Notification | BaseException) -> None:
        while not self._has_been_stopped:
            try:
                self._queue.put_nowait(item)
                return
            except queue.Full:
                await asyncio.sleep(0.01)  # the reader is behind: wait without blocking the loop

    def stop(self) -> None:
        super().stop()
        self._follower.cancel()

    def __exit__(self, *args: object, **kwargs: Any) -> None:
        super().__exit__(*args, **kwargs)
        with contextlib.suppress(BaseException):  # cancelled on purpose; errors were queued
            self._follower.result(timeout=CALL_TIMEOUT)

    def __next__(self) -> Notification:
        while not self._has_been_stopped:
            try:
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                self.stop()
                raise item
            self._last_notification_id = item.id
            return item
        raise StopIteration


class JetStreamTrackingRecorder(JetStreamRecorder, TrackingRecorder):
    def insert_tracking(self, tracking: Tracking) -> None:
        self.datastore.run(self._append([], tracking))

    def max_tracking_id(self, application_name: str) -> int | None:
        subject = self._tracking_subject(application_name)
        return self.datastore.run(self._max_tracking_id(subject))

    async def _max_tracking_id(self, subject: str) -> int | None:
        last = await self.datastore.store.last(subject)
        return await self._last_valid(subject, last, _tracking_id)


class JetStreamProcessRecorder(
    JetStreamTrackingRecorder, JetStreamApplicationRecorder, ProcessRecorder
):
    """Events and their tracking record go into one atomic batch: both or neither."""


class Factory(InfrastructureFactory[JetStreamTrackingRecorder]):
    """``PERSISTENCE_MODULE=services.eventstore:Factory``; reads NATS_URL, NATS_STREAM and
    NATS_CONNECT_TIMEOUT (seconds, default 10), each maybe prefixed with the upper-cased
    application name as the library does (``DOGSCHOOL_NATS_STREAM``)."""

    NATS_URL = "NATS_URL"
    NATS_STREAM = "NATS_STREAM"
    NATS_CONNECT_TIMEOUT = "NATS_CONNECT_TIMEOUT"

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
        self.datastore = JetStreamDatastore(
            self.env.get(self.NATS_URL, DEFAULT_NATS_URL), stream, connect_timeout
        )

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
        self.datastore.close()
