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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sys
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    DataError,
    InfrastructureFactory,
    IntegrityError,
    Notification,
    OperationalError,
    PersistenceError,
    ProcessRecorder,
    ProgrammingError,
    StoredEvent,
    Subscription,
    Tracking,
    TrackingRecorder,
)
from eventsourcing.utils import Environment, EnvType, resolve_topic
from nats.errors import Error as NatsError

from domain.subjects import check_token
from eventstore.persistence_copy import Appended, LocalCopy
from eventstore.persistence_records import (
    TOPIC,
    TRACKING_ID,
    VERSION,
    Quarantined,
    id_token,
    token_id,
)
from eventstore.persistence_records import notification as _notification
from eventstore.persistence_records import stored_event as _stored_event
from eventstore.persistence_records import tracking_id as _tracking_id
from eventstore.persistence_versions import Scan, Versions
from eventstore.store import (
    MAX_BATCH,
    PAGE,
    ConcurrencyError,
    EventStore,
    LimitError,
    Message,
    Recorded,
    StoreError,
    StoreUnavailable,
    Write,
)
from transport.client import Client, connect

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
CONNECT_TIMEOUT = 10.0  # default seconds to reach NATS_URL when a Factory is constructed
CALL_TIMEOUT = 60.0  # seconds a synchronous call waits for the private loop
MAX_CONFLICT_RETRIES = 20  # re-reads after a subject moved under us without a real conflict
MAX_TOPIC_PAGE = 1000  # most events read at once while looking for notifications of some topics
MAX_QUARANTINED = 10_000  # poison messages listed (and logged); past that only counted
LOCAL_COPY_MB = 256  # default bound of the stream's local copy (persistence_copy)

__all__ = ["Factory", "Quarantined", "id_token", "token_id"]

# What an application can do about a save that failed (an eventsourcing app has no idempotency
# key to send again: its retry is the command again, on the aggregate as stored).
MAYBE_SAVED = (
    "the save may or may not have been stored: get the aggregate again (repository.get)"
    " before retrying the command"
)
NOT_SAVED = "nothing was stored: retry the save"


class _PrivateLoop:
    """An asyncio loop in a daemon thread: synchronous code submits coroutines to it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._in_flight: set[Future[Any]] = set()
        self._lock = threading.Lock()

    def _run(self) -> None:
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()  # here, where it ran: any thread may have stopped it

    def on_own_thread(self) -> bool:
        # Alive first: a thread's ident is reused once it ended.
        return self._thread.is_alive() and threading.get_ident() == self._thread.ident

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

    def check(self) -> None:
        """Refuse a synchronous call from where waiting would stall or deadlock a loop."""
        refusal = self._refusal()
        if refusal:
            raise RuntimeError(refusal)

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
                f"JetStream did not answer within {timeout}s (check that nats-server is up); if"
                f" this was a save, {MAYBE_SAVED}"
            ) from None
        except CancelledError:
            raise OperationalError(
                "the persistence factory was closed while this call was running"
            ) from None

    def _refusal(self) -> str | None:
        if self.on_own_thread():
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
        """Stop the loop and end its thread (which closes the loop); from any thread."""
        if self.on_own_thread():  # cannot wait for itself: it stops after this callback
            self.loop.stop()
        elif self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # it closed itself meanwhile
                self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()


class JetStreamDatastore:
    """One stream, one NATS connection and the private loop that owns it."""

    def __init__(
        self,
        url: str,
        stream: str,
        connect_timeout: float = CONNECT_TIMEOUT,
        local_copy_bytes: int = LOCAL_COPY_MB << 20,
    ) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self.stream = check_token(stream, "NATS_STREAM")
        self.prefix = f"es.{stream}"
        self.events_filter = f"{self.prefix}.events.>"
        self._loop = _PrivateLoop(name=f"eventsourcing-jetstream-{stream}")
        self._nc: Client | None = None
        self._subscription_store: EventStore | None = None
        self._subscription_lock = asyncio.Lock()
        self._quarantined: dict[int, Quarantined] = {}  # seq -> why; also "logged already"
        self.quarantined_count = 0  # distinct poison messages met, listed or not
        self._quarantine_lock = threading.Lock()  # read from callers' threads
        self._closed = False
        try:
            self.store: EventStore = self.run(self._open())
            # Which records are valid by version, for the reads that go to the server.
            self.versions = Versions(self.store, self.quarantine)
            self.copy = LocalCopy(self.store, self.prefix, self.quarantine, local_copy_bytes)
            if self.run(self.copy.start()):
                self._loop.submit(self.copy.follow())  # ends with close(): cancel_in_flight
        except BaseException:
            self.close()
            raise

    async def _open(self) -> EventStore:
        # no_echo: the server does not send this connection's appends back to its own
        # subscriptions, the local copy's signal among them: the ack says it all, and each
        # echo cost about as much again as the append (measured).
        self._nc = await self._connect(no_echo=True)
        store = EventStore(self._nc, self.stream, [f"{self.prefix}.>"])
        try:
            await store.ensure_stream()
        except StoreError as e:  # the stream is not as the module needs it
            raise ProgrammingError(str(e)) from e
        return store

    async def _connect(self, **options: Any) -> Client:
        try:
            # nats-py keeps retrying a first connect for minutes: bound it, then say why.
            return await asyncio.wait_for(
                connect(
                    self.url,
                    name=f"eventsourcing-{self.stream}",
                    connect_timeout=2,
                    error_cb=self._on_nats_error,
                    **options,
                ),
                self.connect_timeout,
            )
        except Exception as e:
            raise OperationalError(
                f"cannot connect to NATS_URL={self.url} within {self.connect_timeout}s ({e!r}):"
                " start nats-server or fix NATS_URL"
            ) from e

    async def subscription_store(self) -> EventStore:
        """The store subscriptions follow: on a second connection, opened on first use, whose
        signals include this process's own appends (the first one's do not: no_echo)."""
        async with self._subscription_lock:
            if self._subscription_store is None:
                nc = await self._connect()
                self._subscription_store = EventStore(nc, self.stream, [f"{self.prefix}.>"])
            return self._subscription_store

    async def _on_nats_error(self, error: Exception) -> None:
        log.warning("NATS connection of stream %s: %r", self.stream, error)

    def run(self, coro: Coroutine[Any, Any, T], *, saving: bool = False) -> T:
        """``coro`` on the private loop; the store's and NATS's errors as the library's
        (``saving``: ``coro`` appends, so the error says whether anything may be stored)."""
        try:
            return self._loop.run(coro)
        except Exception as e:
            mapped = self.library_error(e, saving=saving)
            if mapped is e:
                raise
            raise mapped from e

    def library_error(self, e: Exception, *, saving: bool = False) -> Exception:
        """The library's exception for ``e`` (``e`` itself if it is one, or no store error)."""
        if isinstance(e, PersistenceError):
            return e
        if isinstance(e, LimitError):
            return DataError(self._over_limit(e))
        if isinstance(e, StoreUnavailable):
            if not saving:
                return OperationalError(f"{e.reason}; retry")
            return OperationalError(f"{e.reason}; {MAYBE_SAVED if e.stored else NOT_SAVED}")
        if isinstance(e, StoreError):  # a refusal: nothing stored
            return OperationalError(str(e))
        if isinstance(e, NatsError):  # the connection failed (maybe while an append was sent)
            advice = MAYBE_SAVED if saving else "retry"
            return OperationalError(f"NATS connection of stream {self.stream}: {e!r}; {advice}")
        return e

    def _over_limit(self, e: LimitError) -> str:
        if e.limit == "messages":
            return (
                f"one save holds at most {MAX_BATCH} records (its events, and a process"
                f" application's tracking record: one atomic JetStream batch): {e}"
            )
        if e.limit == "subject":
            token = self.store.max_subject_bytes - len(self.subject("events", "s"))
            return (
                f"{e}. An originator id (and a tracking record's application name) is its"
                f" subject's last token, in base64: on stream {self.stream} a str id takes at"
                f" most {token * 3 // 4} UTF-8 bytes (a UUID always fits)"
            )
        return f"{e} (an event's state and topic, and the module's headers)"

    def check(self) -> None:
        self._loop.check()

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
        """Close the connections and end the private loop; quiet and safe from any thread, from
        an Application's ``__del__`` (a GC, at interpreter exit) too."""
        if self._closed or sys.is_finalizing():
            # At interpreter exit (an application never closed: its __del__) the loop's daemon
            # thread may be gone mid-run, so nothing can be waited for: the process ends, and
            # its sockets with it. Every append waited for its ack: nothing is lost.
            return
        self._closed = True
        # Calls still running (a reader thread, a subscription) would hold the connection
        # open: end them first. Every append waited for its ack, so nothing is left to flush.
        self._loop.cancel_in_flight()
        second = self._subscription_store.nc if self._subscription_store else None
        connections = [nc for nc in (self._nc, second) if nc is not None and not nc.is_closed]
        self._nc = self._subscription_store = None
        if self._loop.on_own_thread():  # a GC on the loop's thread: it closes them, then stops
            self._loop.loop.create_task(self._close(connections, then_stop=True))
            return
        if self._loop.loop.is_running():
            with contextlib.suppress(Exception):  # closing anyway; the server may be gone
                self._loop.run(self._close(connections), timeout=10)
        self._loop.close()

    async def _close(self, connections: list[Client], then_stop: bool = False) -> None:
        for nc in connections:
            with contextlib.suppress(Exception):
                await nc.close()
        if then_stop:
            self._loop.close()


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

    def catch_up(self) -> None:
        """Make the reads after this one see everything the stream holds now, other processes'
        appends included (one round trip; reads see this process's own appends anyway)."""
        self.datastore.run(self.datastore.copy.confirm_head())

    def _decode(self, record: Recorded, decode: Callable[[Recorded], T]) -> T | None:
        """``decode(record)``, or None for a poison message (quarantined)."""
        try:
            return decode(record)
        except ValueError as e:
            self.datastore.quarantine(record, str(e))
            return None

    async def _last_event(self, last: Recorded | None) -> StoredEvent | None:
        """The last valid event (or snapshot) of ``last``'s subject, given its last message:
        well-formed, and its version after every earlier one."""
        if last is None:
            return None
        event = self._decode(last, _stored_event)
        versions = self.datastore.versions
        if event is not None and await versions.valid(last, event.originator_version):
            return event
        top = await versions.top(last, event.originator_version if event else None)
        if top is None:
            return None
        seq = top[0]
        for record in await self.datastore.store.read_subject(last.subject, seq - 1):
            if record.seq == seq:
                return _stored_event(record)
        raise OperationalError(f"message {seq} of {last.subject} was read before, not now")

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

    def _insert(self, stored_events: Sequence[StoredEvent], tracking: Tracking | None) -> list[int]:
        """Append all events (and the tracking record) in one atomic write, or nothing; return
        the events' notification ids.

        Each aggregate's new versions must exceed its last recorded version, and the write is
        conditional on each subject's last sequence.  Those come from the local copy when it
        holds the subjects (no round trip before the append; a version it holds already is a
        real conflict); if the server refuses the write, or the copy cannot answer, they are
        read from the server (``_append``)."""
        self.datastore.check()
        insert = _Insert(self, stored_events, tracking)
        if not insert.subjects:
            return []
        known = []
        for subject in insert.subjects:
            last = self.datastore.copy.last(subject)
            if last is None:
                return self.datastore.run(self._append(insert), saving=True)
            known.append(last)
        planned = insert.plan(known)
        return self.datastore.run(self._append_planned(insert, planned), saving=True)

    async def _append_planned(self, insert: _Insert, planned: list[Appended]) -> list[int]:
        try:
            return await self._write(insert, planned)
        except ConcurrencyError:  # the copy was behind on a subject: ask the server
            return await self._append(insert)

    async def _write(self, insert: _Insert, planned: list[Appended]) -> list[int]:
        """Append the planned writes; the copy holds them once acknowledged."""
        seqs = await self.datastore.store.append([_write(p) for p in planned])
        flat = iter(seqs)
        done = [
            Appended(
                p.subject,
                p.expected_last_seq,
                [next(flat) for _ in range(max(len(p.events), 1))],
                p.events,
                p.tracking_id,
            )
            for p in planned
        ]
        self.datastore.copy.acknowledge(done)
        for appended in done:
            if appended.events:
                self.datastore.versions.appended(
                    appended.subject,
                    appended.expected_last_seq,
                    appended.seqs,
                    [e.originator_version for e in appended.events],
                )
        return insert.notification_ids(done)

    async def _append(self, insert: _Insert) -> list[int]:
        """``_insert`` with each subject's last sequence and valid record read from the server;
        a concurrent writer makes the write fail and we read again (a real conflict then shows
        as IntegrityError)."""
        subjects = insert.subjects
        store, copy = self.datastore.store, self.datastore.copy
        refused: ConcurrencyError | None = None
        for attempt in range(MAX_CONFLICT_RETRIES):
            if attempt:  # a busy subject, or a replica answering behind its leader: wait a bit
                await asyncio.sleep(min(0.001 * 2**attempt, 0.1))
            lasts = await asyncio.gather(*(store.last(s) for s in subjects))
            for subject, last in zip(subjects, lasts, strict=True):
                if last is not None:
                    copy.learn(subject, last.seq)  # reads of it never go back before this
            # The versions to be after: the last VALID ones (poison is skipped), while the
            # write stays conditional on each subject's last message, poison or not.
            valid = await asyncio.gather(
                *(self._last_event(last) for _, last in zip(insert.by_subject, lasts, strict=False))
            )
            known: list[_Last] = [
                (last.seq if last else 0, event, None)
                for last, event in zip(lasts, valid, strict=False)
            ]
            if insert.tracking_subject is not None:
                subject, last = insert.tracking_subject, lasts[-1]
                tracked = await self._last_valid(subject, last, _tracking_id)
                known.append((last.seq if last else 0, None, tracked))
            planned = insert.plan(known)
            try:
                return await self._write(insert, planned)
            except ConcurrencyError as e:
                refused = e  # someone wrote one of these subjects since we read it: check again
        raise OperationalError(
            f"gave up after the server refused the append to {subjects} {MAX_CONFLICT_RETRIES}"
            f" times as a conflict ({refused}) with no newer version read: other processes keep"
            " writing these aggregates, or a replicated stream without a quorum of its nodes"
            f" still proposes an earlier write; {NOT_SAVED} later"
        )


_Last = tuple[int, StoredEvent | None, int | None]  # last seq, last valid event, tracking id


class _Insert:
    """One insert_events call: its events by subject (keeping their positions) and tracking."""

    def __init__(
        self, recorder: JetStreamRecorder, events: Sequence[StoredEvent], tracking: Tracking | None
    ) -> None:
        self.events = events
        self.tracking = tracking
        self.by_subject: dict[str, list[int]] = {}
        for index, event in enumerate(events):
            subject = recorder.datastore.subject(recorder.kind, id_token(event.originator_id))
            self.by_subject.setdefault(subject, []).append(index)
        self.subjects = list(self.by_subject)
        self.tracking_subject = None
        if tracking is not None:
            self.tracking_subject = recorder._tracking_subject(tracking.application_name)
            self.subjects.append(self.tracking_subject)

    def plan(self, known: Sequence[_Last]) -> list[Appended]:
        """The writes, given each subject's ``_Last`` in the order of ``subjects``; raises
        IntegrityError for a version or tracking id that is not after the recorded one."""
        planned = []
        for (subject, indexes), (last_seq, last_event, _) in zip(
            self.by_subject.items(), known, strict=False
        ):
            previous = last_event.originator_version if last_event else None
            events = [self.events[i] for i in indexes]
            for event in events:
                if previous is not None and event.originator_version <= previous:
                    raise IntegrityError(
                        f"version {event.originator_version} of {event.originator_id!r} is not"
                        f" after version {previous} (already recorded or repeated): reload and"
                        " retry"
                    )
                previous = event.originator_version
            planned.append(Appended(subject, last_seq, (), events))
        tracking = self.tracking
        if tracking is not None and self.tracking_subject is not None:
            last_seq, _, tracked = known[-1]
            if tracked is not None and tracking.notification_id <= tracked:
                raise IntegrityError(
                    f"tracking id {tracking.notification_id} of {tracking.application_name!r}"
                    f" is not greater than the recorded {tracked}"
                )
            planned.append(
                Appended(self.tracking_subject, last_seq, (), (), tracking.notification_id)
            )
        return planned

    def notification_ids(self, done: Sequence[Appended]) -> list[int]:
        """The events' stream sequences, in the order they were given."""
        ids = [0] * len(self.events)
        for indexes, appended in zip(self.by_subject.values(), done, strict=False):
            for i, seq in zip(indexes, appended.seqs, strict=True):
                ids[i] = seq
        return ids


def _write(planned: Appended) -> Write:
    if planned.tracking_id is not None:
        messages = [Message(data=b"", headers={TRACKING_ID: str(planned.tracking_id)})]
    else:
        messages = [
            Message(data=e.state, headers={TOPIC: e.topic, VERSION: str(e.originator_version)})
            for e in planned.events
        ]
    return Write(planned.subject, messages, expected_last_seq=planned.expected_last_seq)


class JetStreamAggregateRecorder(JetStreamRecorder, AggregateRecorder):
    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        self._insert(stored_events, None)
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
        self.datastore.check()
        subject = self.datastore.subject(self.kind, id_token(originator_id))
        events = self.datastore.copy.history(subject)
        if events == [] and self.kind != "snapshots":
            # Not found: make sure of it (another process may have just written it). A
            # snapshot missed only means reading more events.
            self.catch_up()
            events = self.datastore.copy.history(subject)
        if events is None:
            return self.datastore.run(self._select_events(subject, gt, lte, desc, limit))
        if gt is not None or lte is not None:
            events = [
                e
                for e in events
                if (gt is None or e.originator_version > gt)
                and (lte is None or e.originator_version <= lte)
            ]
        if desc:
            events.reverse()
        return events if limit is None else events[:limit]

    async def _select_events(
        self, subject: str, gt: int | None, lte: int | None, desc: bool, limit: int | None
    ) -> list[StoredEvent]:
        if desc and limit == 1 and lte is None:
            # The latest event or snapshot: what every repository.get() asks first.
            event = await self._last_event(await self.datastore.store.last(subject))
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
        return self._insert(stored_events, kwargs.get("tracking"))

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        self.datastore.check()
        first = max(1, 1 if start is None else start if inclusive_of_start else start + 1)
        found = self.datastore.copy.notifications(first, limit, stop, topics)
        if found is not None:
            return found
        return self.datastore.run(self._select_notifications(first, limit, stop, topics))

    async def _select_notifications(
        self, first: int, limit: int, stop: int | None, topics: Iterable[str]
    ) -> list[Notification]:
        wanted = set(topics)
        found: list[Notification] = []
        store = self.datastore.store
        scan: Scan = {}
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
                notification = await self._valid_notification(record, scan)
                if notification is None or (wanted and notification.topic not in wanted):
                    continue
                found.append(notification)
                if len(found) >= limit:
                    return found
            if len(records) < page:
                return found  # the stream holds no more events (yet)
            first = records[-1].seq + 1
        return found

    async def _valid_notification(
        self, record: Recorded, scan: Scan | None = None
    ) -> Notification | None:
        """The record's notification, None for poison (also a version not after its
        aggregate's earlier ones): quarantined, skipped by every reader."""
        notification = self._decode(record, _notification)
        if notification is None:
            return None
        version = notification.originator_version
        return notification if await self.datastore.versions.valid(record, version, scan) else None

    def max_notification_id(self) -> int | None:
        self.catch_up()
        found = self.datastore.copy.max_notification_id()
        if found is not None:
            return found[0]
        return self.datastore.run(self._max_notification_id())

    async def _max_notification_id(self) -> int | None:
        """The last VALID notification's id: poison at the head is walked back over."""
        store, events = self.datastore.store, self.datastore.events_filter
        last = await store.last(events)
        if last is None or await self._valid_notification(last) is not None:
            return last.seq if last else None
        end = last.seq - 1
        while end >= 1:
            first = max(1, end - PAGE + 1)
            records = [r for r in await store.read(first, end - first + 1, events) if r.seq <= end]
            for record in reversed(records):
                if await self._valid_notification(record) is not None:
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
        store = await datastore.subscription_store()
        replay = store.replay(
            from_seq=(self._last_notification_id or 0) + 1,
            subject_filter=datastore.events_filter,
            follow=True,
        )
        scan: Scan = {}
        try:
            async for record in replay:
                notification = await self._recorder._valid_notification(record, scan)
                if notification is None or (wanted and notification.topic not in wanted):
                    continue
                await self._put(notification)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            await self._put(self._recorder.datastore.library_error(e))
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
        self._insert([], tracking)

    def max_tracking_id(self, application_name: str) -> int | None:
        subject = self._tracking_subject(application_name)
        self.catch_up()
        found = self.datastore.copy.tracked(subject)
        if found is not None:
            return found[0]
        return self.datastore.run(self._max_tracking_id(subject))

    async def _max_tracking_id(self, subject: str) -> int | None:
        last = await self.datastore.store.last(subject)
        return await self._last_valid(subject, last, _tracking_id)


class JetStreamProcessRecorder(
    JetStreamTrackingRecorder, JetStreamApplicationRecorder, ProcessRecorder
):
    """Events and their tracking record go into one atomic batch: both or neither."""


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
