"""A copy of one eventsourcing stream in the process's memory, so the recorders of the
persistence module answer reads in the caller's thread: no round trip to the server, no hop
into the module's event loop.

A follower task in the module's loop reads the stream in order (batched direct gets of up to
1,000 messages) when this process's appends are acknowledged or the server signals another
connection's (the factory's connection is ``no_echo``: an echo of each own append cost about as
much as the append), gathering a burst into one read, and applies each page under a lock:
every aggregate's valid history, every subject's last sequence, the notifications.

What a read sees:

- everything this process appended (any thread, any recorder of the factory) and had
  acknowledged before the read started: the read waits until the copy holds it.  An own
  append is put into its aggregate's history on the ack, so reading one's own write back costs
  no wait at all;
- everything else this process learned the stream holds (the re-read after a conflict, a
  confirmed head): reads never go back in time;
- other processes' appends once the follower has them (it reads on the server's signal, well
  under a millisecond later on one machine).  Where an answer must not miss them, the recorder
  confirms the stream's head first (one round trip): an aggregate that is not found,
  ``max_notification_id``, ``max_tracking_id``;
- notifications as a prefix of the stream: ids in order, none skipped.

Appends never trust the copy alone: each stays conditional on the subject's last sequence, so
a stale copy costs one re-read from the server (then ``IntegrityError`` if the conflict is
real), never a wrong write.  A version the copy already holds is a real conflict (versions only
grow), so that ``IntegrityError`` needs no round trip.

Bounded: the copy takes up to ``limit`` bytes of memory (counted as each message's payload plus
``RECORD_OVERHEAD``, measured for the library's events).  A larger stream (its size at open
or grown past it) is not copied, and the recorders read over the network as before; so do they
until the follower has caught up with the stream as it was when the factory opened.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eventsourcing.persistence import Notification, StoredEvent

from eventstore.persistence_records import stored_event, tracking_id
from eventstore.store import PAGE, EventStore, Recorded

log = logging.getLogger(__name__)

RECORD_OVERHEAD = 900  # bytes a message takes in the copy besides its payload (measured ~850)
WAIT = 10.0  # seconds a read waits for the follower before it reads over the network instead
_POLL = 1.0  # seconds the follower waits for a signal before it reads anyway
# After a signal the follower waits this long for more before it reads (unless a read waits
# for it): one read per burst of appends, not one per append.
_GATHER = 0.002
_SETTLE = (0.0005, 0.002, 0.02, 0.1)  # re-reads after a signal: it can precede the store
_CHASE = (0.0002, 0.001, 0.005, 0.02)  # re-reads while a read waits for a message not read yet


@dataclass(slots=True)
class _Subject:
    """One subject as the copy holds it."""

    last_seq: int = 0  # its last message (poison or not): what an append is conditional on
    events: list[StoredEvent] = field(default_factory=list)  # valid ones, versions ascending
    tracked: int | None = None  # a tracking subject's last valid tracking id


@dataclass(frozen=True, slots=True)
class Appended:
    """What an append puts on one subject: planned (no ``seqs`` yet), then acknowledged (the
    copy holds it at once)."""

    subject: str
    expected_last_seq: int
    seqs: Sequence[int]
    events: Sequence[StoredEvent] = ()
    tracking_id: int | None = None


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Return when ``event`` is set or after ``seconds``."""
    # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


class LocalCopy:
    """The followed copy of one stream (``es.<stream>.>``); thread-safe."""

    def __init__(
        self,
        store: EventStore,
        prefix: str,
        quarantine: Callable[[Recorded, str], None],
        limit: int,
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.limit = limit
        self._quarantine = quarantine
        self._cond = threading.Condition(threading.Lock())
        self.enabled = False
        self.head = 0  # every message up to this stream sequence is applied
        self._ready_at = 0  # the stream's head at open: the copy answers once it holds that
        self._subjects: dict[str, _Subject] = {}
        self._notification_ids: list[int] = []
        self._notifications: list[Notification] = []
        self._bytes = 0
        self._known: dict[str, int] = {}  # subject -> a sequence this process knows it holds
        self._known_head = 0  # the highest sequence this process knows the stream holds
        self._confirmed = 0  # the stream's head as the server last told (confirm_head)
        self._signal: asyncio.Event | None = None  # set with _news or _hurry (loop side)
        self._news = False  # the server signalled a new message (another connection's)
        self._acked = False  # an append of this process was acknowledged
        self._hurry = False  # a read waits for the follower
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting = 0  # reads waiting for the follower (callers' threads)

    # -- the loop's side ---------------------------------------------------------------------

    async def start(self) -> bool:
        """Decide whether to copy (the stream fits the limit); True if the follower should run."""
        if self.limit <= 0:
            return False
        info = await self.store.js.stream_info(self.store.stream)
        size = info.state.bytes + info.state.messages * RECORD_OVERHEAD
        if size > self.limit:
            log.info(
                "stream %s would take %d bytes, over the local copy's %d: reads go to the server",
                self.store.stream,
                size,
                self.limit,
            )
            return False
        self._ready_at = info.state.last_seq
        self._signal = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self.enabled = True
        return True

    async def follow(self) -> None:
        """Read the stream into the copy, for as long as the copy is enabled."""
        signal = self._signal
        assert signal is not None, "start() first"
        sub = await self.store.nc.subscribe_raw(
            f"{self.prefix}.>", lambda _s, _b, _d: self._signal_news()
        )
        settle = chase = 0
        try:
            while self.enabled:
                signal.clear()
                self._news = self._acked = self._hurry = False
                try:
                    page = await self.store.read(self.head + 1, PAGE)
                except Exception as e:  # a timeout, a reconnect: reads wait or go to the server
                    if self.store.nc.is_closed:
                        return
                    log.warning("local copy of %s: %r; reading again", self.store.stream, e)
                    await asyncio.sleep(0.5)
                    continue
                if page:
                    self._apply(page)
                if len(page) == PAGE:
                    continue
                if self._waiting and self._known_head > self.head:
                    # A read waits for a message the server has not answered yet (a replica
                    # behind its leader, the store not done): read again soon.
                    await asyncio.sleep(_CHASE[min(chase, len(_CHASE) - 1)])
                    chase += 1
                    continue
                chase = 0
                if not signal.is_set():
                    if settle:  # the signal before the read may have been early
                        await _wait(signal, _SETTLE[-settle])
                        settle -= 1
                        continue
                    await _wait(signal, _POLL)
                if self._news or self._acked:
                    # A signal can come before the store has the message: read again after
                    # it (an acknowledged append is stored).
                    settle = len(_SETTLE) if self._news else 0
                    deadline = time.monotonic() + _GATHER
                    while not self._hurry and (left := deadline - time.monotonic()) > 0:
                        signal.clear()
                        await _wait(signal, left)
        finally:
            self._disable("the factory is closing")
            with contextlib.suppress(Exception):  # the connection may be closing
                await sub.unsubscribe()

    def _signal_news(self) -> None:
        self._news = True
        if self._signal is not None:
            self._signal.set()

    def _signal_ack(self) -> None:
        self._acked = True
        if self._signal is not None:
            self._signal.set()

    def _rush(self) -> None:
        self._hurry = True
        if self._signal is not None:
            self._signal.set()

    async def confirm_head(self) -> None:
        """Learn the stream's head from the server: reads after this wait until they hold it."""
        if self.enabled:
            head = await self.store.head()
            with self._cond:
                self._confirmed = max(self._confirmed, head)
            self._learn_head(head)

    def learn(self, subject: str, seq: int) -> None:
        """This process saw ``seq`` on ``subject`` (a re-read): reads of it wait for that much."""
        with self._cond:
            if self.enabled and seq > self._known.get(subject, 0):
                self._known[subject] = seq
        self._learn_head(seq)

    def acknowledge(self, appended: Sequence[Appended]) -> None:
        """The server acknowledged an append of this process: its subjects hold it at once
        where the copy holds the subject up to where the append continued it."""
        top = 0
        with self._cond:
            for write in appended:
                last = write.seqs[-1]
                top = max(top, last)
                if not self.enabled:
                    continue
                if last > self._known.get(write.subject, 0):
                    self._known[write.subject] = last
                held = self._subjects.get(write.subject)
                # The server took the append after expected_last_seq: if that is the copy's
                # last message of the subject, the copy lacks nothing of it before the append.
                if (held.last_seq if held else 0) != write.expected_last_seq:
                    continue
                if held is None:
                    held = self._subjects[write.subject] = _Subject()
                held.last_seq = last
                if write.tracking_id is not None:
                    held.tracked = write.tracking_id
                held.events.extend(write.events)
            self._cond.notify_all()
        self._learn_head(top)
        self._signal_ack()  # its signal does not come back to this connection (no_echo)

    def _learn_head(self, seq: int) -> None:
        with self._cond:
            if seq <= self._known_head:
                return
            self._known_head = seq  # a read that needs it pokes the follower (_holds)

    def _apply(self, page: list[Recorded]) -> None:
        with self._cond:
            if not self.enabled:
                return
            for record in page:
                self._apply_one(record)
            self.head = page[-1].seq
            self._cond.notify_all()
            over = self._bytes > self.limit
        if over:
            self._disable(
                f"it outgrew {self.limit} bytes (NATS_LOCAL_COPY_MB); reads go to the server"
            )

    def _apply_one(self, record: Recorded) -> None:
        self._bytes += len(record.data) + RECORD_OVERHEAD
        parts = record.subject.split(".")
        kind = parts[2] if len(parts) == 4 else None
        held: _Subject | None = None
        if kind is not None:
            held = self._subjects.get(record.subject)
            if held is None:
                held = self._subjects[record.subject] = _Subject(last_seq=record.seq)
            elif record.seq <= held.last_seq:
                held = None  # an own append the ack put there already
            else:
                held.last_seq = record.seq
        if kind == "tracking":
            try:
                value = tracking_id(record)
            except ValueError as e:
                self._quarantine(record, str(e))
                return
            if held is not None:
                held.tracked = value
            return
        try:
            event = stored_event(record)
        except ValueError as e:
            self._quarantine(record, str(e))
            return
        if held is not None:  # (None: an own append, in its history since the ack)
            if held.events and event.originator_version <= held.events[-1].originator_version:
                # Appends only ever add later versions: this one was published around them.
                previous = held.events[-1].originator_version
                version = event.originator_version
                self._quarantine(record, f"version {version} is not after {previous}")
                return  # nor a notification: every reader skips it
            held.events.append(event)
        if kind == "events":
            self._notification_ids.append(record.seq)
            self._notifications.append(
                Notification(
                    id=record.seq,
                    originator_id=event.originator_id,
                    originator_version=event.originator_version,
                    topic=event.topic,
                    state=event.state,
                )
            )

    def _disable(self, why: str) -> None:
        with self._cond:
            if not self.enabled:
                return
            self.enabled = False
            self._subjects.clear()
            self._notification_ids.clear()
            self._notifications.clear()
            self._known.clear()
            self._cond.notify_all()
        log.info("local copy of stream %s dropped: %s", self.store.stream, why)

    # -- the callers' side (with the lock held) ------------------------------------------------

    def _holds(self, subject: str | None) -> bool:
        """Wait until the copy holds what this process knows of ``subject`` (None: of the
        stream); False if it cannot answer (reads go to the server then)."""
        if not self.enabled or self.head < self._ready_at:
            return False
        if subject is None:
            need = self._known_head
        else:
            need = max(self._known.get(subject, 0), self._confirmed)
        deadline = time.monotonic() + WAIT
        while self.enabled and self.head < need:
            held = None if subject is None else self._subjects.get(subject)
            if held is not None and held.last_seq >= need:
                return True
            left = deadline - time.monotonic()
            if self._waiting == 0 and self._loop is not None:
                self._loop.call_soon_threadsafe(self._rush)  # read now, not after _GATHER
            if left <= 0:
                log.warning(
                    "local copy of %s is not at %d after %.0fs: reading from the server",
                    self.store.stream,
                    need,
                    WAIT,
                )
                return False
            self._waiting += 1
            try:
                self._cond.wait(left)
            finally:
                self._waiting -= 1
        return self.enabled

    # -- the callers' side ---------------------------------------------------------------------

    def history(self, subject: str) -> list[StoredEvent] | None:
        """The subject's valid events in version order; None: ask the server."""
        with self._cond:
            if not self._holds(subject):
                return None
            held = self._subjects.get(subject)
            return list(held.events) if held else []

    def last(self, subject: str) -> tuple[int, StoredEvent | None, int | None] | None:
        """(last sequence, last valid event, last valid tracking id) of the subject, for a
        conditional append; None: ask the server."""
        with self._cond:
            if not self._holds(subject):
                return None
            held = self._subjects.get(subject)
            if held is None:
                return 0, None, None
            return held.last_seq, held.events[-1] if held.events else None, held.tracked

    def tracked(self, subject: str) -> tuple[int | None] | None:
        """(the last valid tracking id,) of a tracking subject; None: ask the server."""
        with self._cond:
            if not self._holds(None):  # what it knows of the stream covers the subject
                return None
            held = self._subjects.get(subject)
            return (held.tracked if held else None,)

    def notifications(
        self, first: int, limit: int, stop: int | None, topics: Sequence[str]
    ) -> list[Notification] | None:
        """Up to ``limit`` notifications with first <= id (<= stop); None: ask the server."""
        with self._cond:
            if not self._holds(None):
                return None
            start = bisect.bisect_left(self._notification_ids, first)
            end = (
                len(self._notification_ids)
                if stop is None
                else bisect.bisect_right(self._notification_ids, stop)
            )
            if not topics:
                return self._notifications[start : min(end, start + limit)]
            wanted = set(topics)
            found: list[Notification] = []
            for note in self._notifications[start:end]:
                if note.topic in wanted:
                    found.append(note)
                    if len(found) >= limit:
                        break
            return found

    def max_notification_id(self) -> tuple[int | None] | None:
        """(the last valid notification's id,); None: ask the server."""
        with self._cond:
            if not self._holds(None):
                return None
            return (self._notification_ids[-1] if self._notification_ids else None,)
