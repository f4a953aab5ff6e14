"""The eventsourcing persistence module's recorders: aggregate, application (with its
notifications and subscriptions), tracking and process recorders on one stream, each a
synchronous face over the datastore's private loop."""

from __future__ import annotations

import asyncio
import contextlib
import queue
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    IntegrityError,
    Notification,
    OperationalError,
    ProcessRecorder,
    StoredEvent,
    Subscription,
    Tracking,
    TrackingRecorder,
)

from domain.subjects import check_token
from eventstore.persistence_copy import Appended
from eventstore.persistence_datastore import CALL_TIMEOUT, NOT_SAVED, JetStreamDatastore
from eventstore.persistence_records import (
    TOPIC,
    TRACKING_ID,
    VERSION,
    Quarantined,
    id_token,
)
from eventstore.persistence_records import notification as _notification
from eventstore.persistence_records import stored_event as _stored_event
from eventstore.persistence_records import tracking_id as _tracking_id
from eventstore.persistence_versions import Scan
from eventstore.store import (
    PAGE,
    ConcurrencyError,
    Message,
    Recorded,
    Write,
)

T = TypeVar("T")

MAX_CONFLICT_RETRIES = 20  # re-reads after a subject moved under us without a real conflict
MAX_TOPIC_PAGE = 1000  # most events read at once while looking for notifications of some topics


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
