"""The read half of the event store: direct gets, a subject's history, pages and replay.

Read-after-write on a cluster: a direct get may be answered by any replica (or a mirror), and
one that lags answers from before the last write (ADR-31; nats-server 2.15 ignores the
``min_last_seq`` of a direct get).  So the store remembers, per subject, the least last
sequence it knows the subject has (``_floors``: its own appends, the sequence a conflict
names, what it read before) and never returns a read of that subject from below it: it asks
again, after short pauses, until a replica that has caught up answers (``_fresh``).  Reads by
stream order (replay, pages) are for followers of the log, which wait anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.client import JetStreamContext
from nats.js.errors import ServiceUnavailableError

from domain.codec import REFLECTED_HEADER
from eventstore.messages import MAX_CONTROL_LINE, Recorded, StoreError, StoreUnavailable
from eventstore.tail import SharedTail
from transport.client import Client, parse_header_lines

# Headers a direct get adds to the stored ones; stripped so both read paths return the same.
_DIRECT_HEADERS = (
    "Nats-Stream",
    "Nats-Subject",
    "Nats-Sequence",
    "Nats-Time-Stamp",
    "Nats-Num-Pending",
    "Nats-Last-Sequence",
)
NO_STATUS = b"NATS/1.0\r\n"  # a header block without a status line: a stored message
_SEQUENCE_LINE = b"\r\nNats-Sequence:"
PAGE = 1000  # messages per batched direct get request: the most a replay page holds
_FOLLOW_POLL = 1.0  # seconds a following replay waits for a signal before reading anyway
# After a signal, re-read after each of these pauses (or at the next signal): a core subscriber
# can get a message before the stream has stored it.
_SETTLE = (0.002, 0.02, 0.1)
# A read that came from a replica behind what the store knows is asked again after these pauses
# (a follower applies a write milliseconds after the quorum acknowledged it); then StoreError.
_LAG_PAUSES = (0.002, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
# Pauses before a batched read asks again after a continuation that brought nothing, though the
# batch before counted more pending (_direct_pages): then it ends.
_EMPTY_PAUSES = _LAG_PAUSES[:3]
# A direct get answered "no responders" (503) is asked again after these pauses: a node that
# just restarted or rejoined knows its peers' replicas a moment after it answers clients (CI
# once read through one in that moment).  Then StoreUnavailable.
_UNSERVED_PAUSES = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
_FLOORS_KEPT = 100_000  # subjects whose floor is remembered; the oldest go first
_T = TypeVar("_T")


class _Unserved(StoreUnavailable):
    """No replica answered a direct get (503): asked again a while before it is raised."""


class StoreReads:
    """Reads of one JetStream stream, never older than what the store knows a subject holds.

    The read half of EventStore, which sets this state in its ``__init__``."""

    nc: Client
    js: JetStreamContext
    stream: str
    subjects: list[str]
    timeout: float
    tail: SharedTail
    _direct: str  # the stream's direct get subject
    _slots: asyncio.Semaphore  # requests to the stream awaiting their answer
    _floors: dict[str, int]  # subject -> the least last stream sequence it is known to have

    async def head(self) -> int:
        """The stream's last sequence (0 while empty). A reader in an account without
        JetStream has no stream info (the log's account exports it direct gets only): its head
        is the last record's sequence, which a lease record that expired may put below."""
        if self.nc.in_log_account:
            try:
                return int((await self.js.stream_info(self.stream)).state.last_seq)
            except (NoRespondersError, ServiceUnavailableError):
                pass  # a server whose accounts this client does not know of
        last = await self.last(">", expiring=True)
        return last.seq if last is not None else 0

    async def last(
        self, subject: str, *, urgent: bool = False, expiring: bool = False
    ) -> Recorded | None:
        """The subject's last message (``subject`` may hold wildcards), None if it has none;
        never older than what this store wrote or read of the subject (read-after-write).
        ``urgent``: not queued behind the requests in flight.  ``expiring``: the subject's
        messages have a TTL (a lease), so a read below an earlier one is no lag: no floor."""
        if expiring:
            return await self._last(subject, urgent)
        return await self._fresh(subject, lambda: self._last(subject, urgent), _seq_or_zero)

    async def _served(self, read: Callable[[], Awaitable[_T]]) -> _T:
        """``read()``, asked again a few times while no replica serves direct gets (503)."""
        for pause in _UNSERVED_PAUSES:
            try:
                return await read()
            except _Unserved:
                await asyncio.sleep(pause)
        return await read()

    async def _last(self, subject: str, urgent: bool = False) -> Recorded | None:
        if urgent:  # its caller asks again on its own clock (the managers' lease): no 503 ride
            return await self._last_once(subject, urgent)
        return await self._served(lambda: self._last_once(subject))

    async def _ask(
        self, subject: str, data: bytes, headers: dict[str, str] | None = None
    ) -> tuple[bytes | None, bytes]:
        """One request's answer, raw: its header block (None if it has none) and payload.  On
        the client's reply inbox (no Msg object, no parsed headers, no ``wait_for``: an append
        costs the client no more than a raw ``js.publish``).  TimeoutError after the store's
        timeout; the caller holds a slot (or is urgent)."""
        answer: asyncio.Future[tuple[bytes | None, bytes]] = (
            asyncio.get_running_loop().create_future()
        )

        def on_msg(block: bytes | None, body: bytes) -> None:
            if not answer.done():
                answer.set_result((block, body))

        inbox = await self.nc.reply_inbox(on_msg)
        try:
            await self.nc.publish(subject, data, reply=inbox, headers=headers)
            async with asyncio.timeout(self.timeout):  # not wait_for: see replay
                return await answer
        finally:
            self.nc.end_reply(inbox)

    async def _last_once(self, subject: str, urgent: bool = False) -> Recorded | None:
        # Raw, like the batches: the header block is read whole (see _stored).
        # The subject in the request's own subject (as ADR-31 has it), unless that line would be
        # too long for the server (it would close the connection): then in the request body.
        request, body = f"{self._direct}.{subject}", b""
        if len(request.encode()) + self.nc.reply_subject_max() + 3 > MAX_CONTROL_LINE:
            request, body = self._direct, json.dumps({"last_by_subj": subject}).encode()
        try:
            async with contextlib.nullcontext() if urgent else self._slots:
                block, data = await self._ask(request, body)
        except TimeoutError:
            raise self._no_direct_answer() from None
        if block is not None and block.startswith(NO_STATUS):
            return _stored(block, data).record
        code, description = status_line(block or b"")
        if code == "404":
            return None
        if code == "503":
            raise self._no_direct_get()
        raise StoreError(f"last message of {subject}: status {code} {description}".strip())

    def _no_direct_answer(self) -> StoreUnavailable:
        """A direct get unanswered within the store's timeout."""
        return StoreUnavailable(
            f"stream {self.stream} did not answer a direct get in {self.timeout}s", stored=None
        )

    def _no_direct_get(self) -> StoreUnavailable:
        """A direct get answered "no responders" (503)."""
        return _Unserved(
            f"stream {self.stream} does not answer direct gets: no replica of it serves them now"
            " (a cluster electing a leader, or without a quorum of its nodes), or there is no"
            " such stream",
            stored=None,
        )

    async def last_seq(self, subject: str) -> int:
        """The stream sequence of the subject's last message, 0 if it has none."""
        last = await self.last(subject)
        return 0 if last is None else last.seq

    async def read_subject(
        self, subject: str, after_seq: int = 0, *, at_least: int = 0
    ) -> list[Recorded]:
        """One aggregate's history in order (messages with seq > after_seq), up to at least
        what this store wrote or read of the subject (read-after-write), and ``at_least``:
        a sequence the caller knows the subject reached (it read a message of it there)."""
        if type(after_seq) is not int or after_seq < 0:
            raise ValueError(f"after_seq must be an int >= 0, got {after_seq!r}")
        if at_least:
            self._saw(subject, at_least)

        def read() -> Awaitable[list[Recorded]]:
            return self._direct_batch({"seq": after_seq + 1, "next_by_subj": subject})

        if self._floors.get(subject, 0) <= after_seq:
            # Nothing past what the caller has is known: an empty answer is no lag (and
            # ``after_seq`` is no evidence that the subject reached it).
            msgs = await read()
            if msgs:
                self._saw(subject, msgs[-1].seq)
            return msgs
        return await self._fresh(subject, read, lambda msgs: msgs[-1].seq if msgs else 0)

    async def _fresh(
        self,
        subject: str,
        read: Callable[[], Awaitable[_T]],
        last_of: Callable[[_T], int],
    ) -> _T:
        """``read()`` of ``subject``, asked again while the replica that answered is behind the
        subject's floor (it has not applied a write the store knows of yet)."""
        floor = self._floors.get(subject, 0)
        for pause in (*_LAG_PAUSES, None):
            got = await read()
            seen = last_of(got)
            if seen >= floor:
                self._saw(subject, seen)
                return got
            if pause is None:
                raise StoreUnavailable(
                    f"the replicas of stream {self.stream} that answered are behind {subject}'s"
                    f" sequence {floor} (they answered up to {seen}) after"
                    f" {sum(_LAG_PAUSES):g}s: is the cluster partitioned? (when it heals)",
                    stored=None,
                )
            await asyncio.sleep(pause)
        raise AssertionError("unreachable: the last pause is None")

    def _saw(self, subject: str, seq: int) -> None:
        """``subject`` has at least ``seq`` (a write acknowledged, a conflict, a read)."""
        floors = self._floors
        if seq > floors.get(subject, 0):
            floors.pop(subject, None)  # re-inserted last: the dict's order is least recent first
            if len(floors) >= _FLOORS_KEPT:
                del floors[next(iter(floors))]
            floors[subject] = seq

    async def read(
        self, from_seq: int, limit: int, subject_filter: str | None = None
    ) -> list[Recorded]:
        """At most ``limit`` messages from ``from_seq`` in stream order (only those matching
        ``subject_filter`` if given); fewer only when the stream holds no more yet.

        A bounded page for callers that want a few messages: unlike replay(), nothing past the
        page is sent to us."""
        if type(from_seq) is not int or from_seq < 1:
            raise ValueError(f"from_seq must be an int >= 1, got {from_seq!r}")
        if type(limit) is not int or limit < 0:
            raise ValueError(f"limit must be an int >= 0, got {limit!r}")
        if limit == 0:
            return []
        return await self._direct_batch(
            {"seq": from_seq, "next_by_subj": subject_filter or ">"}, limit=limit
        )

    async def _direct_get(self, req: dict[str, Any]) -> Recorded | None:
        return await self._served(lambda: self._direct_get_once(req))

    async def _direct_get_once(self, req: dict[str, Any]) -> Recorded | None:
        try:
            async with self._slots:
                msg = await self.nc.request(
                    self._direct, json.dumps(req).encode(), timeout=self.timeout
                )
        except NoRespondersError:
            raise self._no_direct_get() from None
        except NatsTimeoutError:
            raise self._no_direct_answer() from None
        headers = msg.headers or {}
        if "Nats-Sequence" in headers:
            return _from_direct(msg)
        if headers.get("Status") == "404":
            return None
        if headers.get("Status") == "503":
            raise self._no_direct_get()
        raise StoreError(f"direct get {req} from {self.stream}: {_status(msg)}")

    async def _direct_batch(self, req: dict[str, Any], limit: int | None = None) -> list[Recorded]:
        """The messages a batched direct get request selects, in order, at most ``limit``
        (server 2.11+)."""

        async def read() -> list[Recorded]:
            async with self._slots:
                return await self._direct_pages(req, limit)

        return await self._served(read)

    async def _direct_pages(self, req: dict[str, Any], limit: int | None) -> list[Recorded]:
        out: list[Recorded] = []
        done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        pending = 0

        def on_msg(block: bytes | None, data: bytes) -> None:
            nonlocal pending
            if done.done():
                return  # a failed page: the rest is ignored
            try:
                if block is None:
                    raise ValueError("a reply without headers")
                if block.startswith(NO_STATUS):  # a stored message
                    record = _stored(block, data)
                    pending = record.pending
                    out.append(record.record)
                else:  # end of batch (204), nothing found (404), or an error status
                    code, description = status_line(block)
                    done.set_result(
                        None if code in ("204", "404") else f"status {code} {description}".strip()
                    )
            except Exception as e:  # never into nats-py's reader; the page fails instead
                done.set_exception(StoreError(f"bad direct get reply from {self.stream}: {e!r}"))

        inbox = await self.nc.reply_inbox(on_msg)
        empty = 0  # continuations in a row that brought nothing
        try:
            while True:
                had = len(out)
                want = PAGE if limit is None else min(PAGE, limit - len(out))
                req = {**req, "batch": want}
                await self.nc.publish(self._direct, json.dumps(req).encode(), reply=inbox)
                try:
                    async with asyncio.timeout(self.timeout):  # not wait_for: see replay
                        error = await done
                except TimeoutError:
                    raise self._no_direct_answer() from None
                if error == "status 503":
                    raise self._no_direct_get()
                if error is not None:
                    raise StoreError(f"direct get {req} from {self.stream}: {error}")
                if not out or pending == 0 or (limit is not None and len(out) >= limit):
                    return out
                done = asyncio.get_running_loop().create_future()
                if len(out) == had:
                    # Nothing, though the batch before counted more pending: a replica behind
                    # the one that counted answered (asked again after a pause), or the count
                    # included messages whose TTL expired but are not yet removed (a lapsed
                    # lease: asking on got 404 for ever, at full speed).  A few tries, then the
                    # read ends with what it has.
                    if empty == len(_EMPTY_PAUSES):
                        return out
                    await asyncio.sleep(_EMPTY_PAUSES[empty])
                    empty += 1
                    continue
                empty = 0
                # More than one batch (or the server capped its bytes): continue after the last.
                req = {**req, "seq": out[-1].seq + 1}
                req.pop("start_time", None)
        finally:
            self.nc.end_reply(inbox)

    async def replay(
        self,
        *,
        from_seq: int = 1,
        until_seq: int | None = None,
        subject_filter: str | None = None,
        follow: bool = False,
    ) -> AsyncGenerator[Recorded, None]:
        """Every message from ``from_seq`` in stream order, one at a time: see replay_pages."""
        pages = self.replay_pages(
            from_seq=from_seq, until_seq=until_seq, subject_filter=subject_filter, follow=follow
        )
        async with contextlib.aclosing(pages):
            async for page in pages:
                for record in page:
                    yield record

    async def replay_pages(
        self,
        *,
        from_seq: int = 1,
        until_seq: int | None = None,
        subject_filter: str | None = None,
        follow: bool = False,
        share: bool = True,
    ) -> AsyncGenerator[list[Recorded], None]:
        """Every message from ``from_seq`` in stream order, in pages of up to 1,000 (never
        empty); stops when caught up (or at ``until_seq``) unless ``follow``, then waits for
        new ones.  A follow of the whole log that caught up takes the pages of the store's
        shared tail (eventstore.tail) unless ``share`` is False.

        Pulled in pages of read() at the caller's pace (the next page is fetched while the
        caller takes this one), so a slow caller holds at most two pages (a sharing one, up to
        tail.MAX_RECORDS records) and never loses a message; a pushed consumer would overflow
        its client buffer and drop some.  A page may be another follower's too: never change
        one.  Following,
        a core subscription on the same subjects says "something new" (a JetStream publish
        reaches core subscribers too); only the read is trusted, so a lost or early signal
        costs latency, never a message, and a poll every ``_FOLLOW_POLL`` s backs it up."""
        if type(from_seq) is not int or from_seq < 1:
            raise ValueError(f"from_seq must be an int >= 1, got {from_seq!r}")
        if until_seq is not None and (type(until_seq) is not int or until_seq < from_seq - 1):
            raise ValueError(f"until_seq must be an int >= from_seq - 1, got {until_seq!r}")
        if until_seq is not None and until_seq < from_seq:
            return
        # A filtered follow ends once the stream holds until_seq (no later message can match at
        # or before it): the stream's head must be taken *before* the read that comes up short.
        bounded = follow and until_seq is not None and bool(subject_filter)
        woke = asyncio.Event()
        signals: list[Subscription] = []

        async def listen() -> None:
            for subject in [subject_filter] if subject_filter else self.subjects:
                # Raw: a signal is called in the reader, without a message object or a task.
                signals.append(await self.nc.subscribe_raw(subject, lambda *_: woke.set()))

        async def deaf() -> None:
            while signals:
                with contextlib.suppress(Exception):  # the connection may be closing
                    await signals.pop().unsubscribe()

        shared = follow and share and subject_filter is None and until_seq is None
        if follow:
            await listen()
        ahead: asyncio.Task[list[Recorded]] | None = None

        def fetch(seq: int) -> asyncio.Task[list[Recorded]]:
            woke.clear()  # a signal from now on may be for a message this read misses
            return asyncio.ensure_future(self.read(seq, limit(seq), subject_filter))

        def limit(seq: int) -> int:
            # No more than until_seq - seq + 1 messages can lie in seq..until_seq.
            return PAGE if until_seq is None else min(PAGE, until_seq - seq + 1)

        try:
            seq = from_seq
            settle = 0  # quick re-reads left after a signal (its message may not be stored yet)
            task = asyncio.current_task()
            while True:
                if task is not None and task.cancelling():
                    # nats-py swallows a CancelledError in places (e.g. _flush_pending); a
                    # cancel lost there must still end a follow that would otherwise run on.
                    raise asyncio.CancelledError
                head = None
                if bounded and ahead is None:
                    head = await self.head()
                page = await (ahead or fetch(seq))
                ahead = None
                full = len(page) == limit(seq)
                if page:
                    seq = page[-1].seq + 1
                    if full and (until_seq is None or seq <= until_seq):
                        ahead = fetch(seq)
                if until_seq is not None and page and page[-1].seq > until_seq:
                    page = [r for r in page if r.seq <= until_seq]
                if page:
                    yield page
                if until_seq is not None and seq > until_seq:
                    return
                if full:
                    continue
                # Caught up.
                if not follow:
                    return
                if shared:
                    await deaf()  # the tail's signals wake it: ours would cost a message each
                    pages = self.tail.pages(seq)
                    async with contextlib.aclosing(pages):
                        async for page in pages:
                            seq = page[-1].seq + 1
                            yield page
                    # Dropped (too far behind, or the tail's read failed): read on our own.
                    await listen()
                    continue
                if bounded:
                    if head is None:
                        continue  # read once more, knowing the head
                    if until_seq is not None and head >= until_seq:
                        return
                if woke.is_set():
                    settle = len(_SETTLE)
                    continue
                # Wait for a signal, at most the next settle pause (a signalled message may not
                # have been stored when it was read), else the poll's.  A signal ends the wait
                # at once: a pause slept through would hold a new message back for all of it
                # (an event another process wrote reached the manager up to 100 ms late).
                pause = _SETTLE[-settle] if settle else _FOLLOW_POLL
                settle = max(settle - 1, 0)
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await woke.wait()
                if woke.is_set():
                    settle = len(_SETTLE)
        finally:
            if ahead is not None:
                ahead.cancel()
                await asyncio.wait([ahead])  # its inbox unsubscribed; raises nothing of its own
            await deaf()


def _seq_or_zero(record: Recorded | None) -> int:
    return 0 if record is None else record.seq


def _from_direct(msg: Msg) -> Recorded:
    return _record(dict(msg.headers or {}), msg.data)


def status_line(block: bytes) -> tuple[str, str]:
    """(code, description) of a header block's status line (``NATS/1.0 404 Not Found``)."""
    status, _, description = block.split(b"\r\n", 1)[0][9:].partition(b" ")
    return status.decode(errors="replace").strip(), description.decode(errors="replace").strip()


class _Stored(NamedTuple):
    record: Recorded
    pending: int  # Nats-Num-Pending of a batch reply


def _stored(block: bytes, data: bytes) -> _Stored:
    """The stored message a direct get reply carries (its raw header block and payload).

    A stored message whose own headers already hold a direct get's (``Nats-Sequence``) is
    marked ``REFLECTED_HEADER``: nats-server answers a JetStream request on any reply subject
    its requester names, unchecked, so a reader can have an answer land on a subject the stream
    captures; no writer appended it.  Only the raw block shows it: parsed, the reply's own
    header of the same name wins."""
    headers = parse_header_lines(block[len(NO_STATUS) :])
    pending = int(headers.get("Nats-Num-Pending", 0))
    record = _record(headers, data)
    first = block.find(_SEQUENCE_LINE)
    if first >= 0 and block.find(_SEQUENCE_LINE, first + 1) >= 0:
        end = block.find(b"\r\n", first + 2)
        original = block[first + len(_SEQUENCE_LINE) : end].decode(errors="replace").strip()
        headers[REFLECTED_HEADER] = original  # the same dict the record holds
    return _Stored(record, pending)


def _record(headers: dict[str, str], data: bytes) -> Recorded:
    """The stored message a direct get reply carries; ``headers`` loses the reply's own."""
    seq = int(headers["Nats-Sequence"])
    subject = headers["Nats-Subject"]
    time = datetime.fromisoformat(headers["Nats-Time-Stamp"])
    for name in _DIRECT_HEADERS:
        headers.pop(name, None)
    return Recorded(seq, subject, headers, data, time)


def _status(msg: Msg) -> str:
    headers = msg.headers or {}
    return f"status {headers.get('Status')} {headers.get('Description', '')}".strip()
