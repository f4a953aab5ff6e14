"""The event store on JetStream: asyncio API for the services.

One stream (file storage, deletes and purges denied), one subject per aggregate.  Values of
"sequence" are always *stream* sequences; aggregate versions are the callers' business.

How a retried command is recognised (measured on nats-server 2.15): the first message of every
append carries ``Nats-Msg-Id: <idempotency key>``.
- One message: without an expected sequence the server answers a duplicate with the original
  sequence (``duplicate: true``).  With ``Nats-Expected-Last-Subject-Sequence`` the server checks
  the sequence *before* duplicates, so a retry gets "wrong last sequence" (10071).
- Atomic batch: ``Nats-Msg-Id`` is allowed; a batch holding an id seen within the duplicate
  window is refused whole with err_code 10201 ("atomic publish batch contains duplicate message
  id") and no sequences.
In both refusals the store looks at the first message after the expected sequence on the first
subject (or, without one, the subject's messages of the duplicate window): if it carries the key,
the command was already appended and, since a committed batch is stored contiguously, its
sequences are ``first .. first + n - 1`` (checked against the stored ``Nats-Batch-Id``).

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
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, NamedTuple, TypeVar

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import (
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError

from domain import subjects
from domain.codec import REFLECTED_HEADER
from eventstore.tail import SharedTail
from transport.client import Client, cluster_replicas, parse_header_lines

MAX_BATCH = 1000  # the server's limit for one atomic batch
# nats-server's default max_control_line: a client line longer than this (a publish's
# "HPUB <subject> <reply> <header bytes> <total bytes>") closes the connection.
MAX_CONTROL_LINE = 4096
MAX_HEADERS = 65535  # JetStream refuses a message whose header block is larger (err_code 10097)

# Protocol headers
MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
MSG_TTL = "Nats-TTL"  # a message's own time to live (streams with allow_msg_ttl)
BATCH_ID = "Nats-Batch-Id"
BATCH_SEQ = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"

# JetStream err_codes the store maps
ERR_WRONG_LAST_SEQUENCE = 10071  # "wrong last sequence: N" (one server, or the store's check)
# "wrong last sequence" with no N: a replicated stream refuses a message expecting a subject's
# sequence while another message expecting it is still being proposed, or a batch that writes
# a subject it also checks.  A lost race all the same (nats.py's KV maps both alike).
ERR_WRONG_LAST_SEQUENCE_CONSTANT = 10164
WRONG_LAST = frozenset({ERR_WRONG_LAST_SEQUENCE, ERR_WRONG_LAST_SEQUENCE_CONSTANT})
ERR_BATCH_DUPLICATE_MSG_ID = 10201

# The most the batch headers _publish_batch adds take (id, sequence up to MAX_BATCH, commit).
_BATCH_HEADER_BYTES = sum(
    len(f"{name}: {value}\r\n")
    for name, value in ((BATCH_ID, "0" * 32), (BATCH_SEQ, str(MAX_BATCH)), (BATCH_COMMIT, "1"))
)
_REQUEST_TOKEN = 27  # a request's reply: <inbox>.<22 characters of nuid + 4 of hex>

# Headers a direct get adds to the stored ones; stripped so both read paths return the same.
_DIRECT_HEADERS = (
    "Nats-Stream",
    "Nats-Subject",
    "Nats-Sequence",
    "Nats-Time-Stamp",
    "Nats-Num-Pending",
    "Nats-Last-Sequence",
)
_NO_STATUS = b"NATS/1.0\r\n"  # a header block without a status line: a stored message
_SEQUENCE_LINE = b"\r\nNats-Sequence:"
IN_FLIGHT = 64  # requests to the stream awaiting their answer (EventStore.__init__)
PAGE = 1000  # messages per batched direct get request: the most a replay page holds
_FOLLOW_POLL = 1.0  # seconds a following replay waits for a signal before reading anyway
# After a signal, re-read after each of these pauses (or at the next signal): a core subscriber
# can get a message before the stream has stored it.
_SETTLE = (0.002, 0.02, 0.1)
# A read that came from a replica behind what the store knows is asked again after these pauses
# (a follower applies a write milliseconds after the quorum acknowledged it); then StoreError.
_LAG_PAUSES = (0.002, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
# Pauses before a batched read asks again after a continuation that brought nothing, though the
# batch before counted more pending (store._direct_pages): then it ends.
_EMPTY_PAUSES = _LAG_PAUSES[:3]
# An idempotent append unanswered (no stream leader yet, a connection moving) is sent again
# after these pauses: a cluster elects a new leader within seconds of a node's loss.
_ELECTION_PAUSES = (0.1, 0.25, 0.5, 1.0, 1.0, 2.0, 2.0)
# A direct get answered "no responders" (503) is asked again after these pauses: a node that
# just restarted or rejoined knows its peers' replicas a moment after it answers clients (CI
# once read through one in that moment).  Then StoreUnavailable.
_UNSERVED_PAUSES = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
_UNAVAILABLE = 503  # JetStream's answer while a stream (or the meta layer) has no leader
_FLOORS_KEPT = 100_000  # subjects whose floor is remembered; the oldest go first
_WRONG_LAST = re.compile(r"wrong last sequence: (\d+)")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Message:
    """One message to append: payload bytes and headers (event type, schema version, ...)."""

    data: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Write:
    """Messages for one subject, appended only if that subject's last stream sequence is still
    ``expected_last_seq`` (0 = the subject is empty; None = no check).

    ``expected_subject``: the check is on that other subject of the stream instead (a fence:
    the write is refused once a lease subject moved on).

    ``check_only``: the write says nothing but its check (a fence's one message): when the
    append has a message that checks nothing itself (a subject's second, say), the check moves
    into that message's headers and this message is not stored.  nats-server then stages and
    stores one message less, and the log keeps no record that expires (each one an interior
    delete that direct gets walk past); the term stays in the carrier's headers."""

    subject: str
    messages: Sequence[Message]
    expected_last_seq: int | None = None
    expected_subject: str | None = None
    check_only: bool = False


@dataclass(frozen=True, slots=True)
class Recorded:
    """A message as stored: its stream sequence, subject, headers, payload, and store time.

    ``headers`` are the stored headers, including the store's own ``Nats-Msg-Id``,
    ``Nats-Expected-Last-Subject-Sequence`` and ``Nats-Batch-*`` where they were sent."""

    seq: int
    subject: str
    headers: Mapping[str, str]
    data: bytes
    time: datetime


class ConcurrencyError(Exception):
    """A subject moved on since the caller read it: reload and decide again. Nothing was written."""

    def __init__(self, subject: str, expected_last_seq: int | None, detail: str = "") -> None:
        self.subject = subject
        self.expected_last_seq = expected_last_seq
        super().__init__(
            f"{subject} was changed by someone else (expected last sequence {expected_last_seq})"
            f"{': ' + detail if detail else ''}; reload it and try again"
        )


class StoreError(Exception):
    """JetStream refused or could not take a request for another reason than a conflict."""


class StoreUnavailable(StoreError):
    """The stream did not take or answer a request now: no answer in time, no stream leader (a
    cluster electing one, or without a quorum), no connection.  Worth a retry.

    ``reason`` says what happened; ``stored`` is for an append: False if it was certainly not
    stored, True if it may have been (unanswered); None for a read."""

    def __init__(self, reason: str, stored: bool | None) -> None:
        if stored is None:
            advice = "retry"
        elif stored:
            advice = "it may or may not be stored: retry with the same idempotency key"
        else:
            advice = "nothing was stored: retry"
        super().__init__(f"{reason}; {advice}")
        self.reason = reason
        self.stored = stored


class _Unserved(StoreUnavailable):
    """No replica answered a direct get (503): asked again a while before it is raised."""


class LimitError(ValueError):
    """An append the server would not take, refused before anything was sent: too many
    messages, a subject too long for a NATS protocol line, headers or a message too large.
    (nats-server closes the connection on a line or message over its limits.)

    ``limit``: which one ("messages", "subject", "headers", "max_payload")."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class EventStore:
    """Append and read messages of one JetStream stream."""

    def __init__(
        self,
        nc: Client,
        stream: str,
        subjects: Sequence[str],
        *,
        duplicate_window: float = 120.0,
        timeout: float = 5.0,
        in_flight: int = IN_FLIGHT,
    ) -> None:
        if duplicate_window <= 0:
            raise ValueError(f"duplicate_window must be > 0 seconds, got {duplicate_window}")
        if not isinstance(nc, Client):  # replay reads through Client.subscribe_raw
            raise TypeError(
                f"the event store needs transport.client.Client, got {type(nc).__name__}:"
                " connect with transport.client.connect"
            )
        self.nc = nc
        self.js = nc.jetstream()
        self.stream = stream
        self.subjects = list(subjects)
        self.duplicate_window = duplicate_window
        self.timeout = timeout
        self._direct = f"$JS.API.DIRECT.GET.{stream}"
        # Requests to the stream (appends, direct gets) awaiting their answer: at most this
        # many, the rest wait here. A burst of thousands sent at once would each time out
        # behind the others (the server and our reader work through them in order), so the
        # timeout starts when a request is sent, and a burst queues instead of failing.
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1, got {in_flight}")
        self._slots = asyncio.Semaphore(in_flight)
        self.msg_ttl = False  # whether the stream takes per-message TTLs (ensure_stream says)
        # subject -> the least last stream sequence it is known to have (read-after-write).
        self._floors: dict[str, int] = {}
        self._max_subject: tuple[int, int] | None = None  # (max_payload, max_subject_bytes)
        self.tail = SharedTail(self, PAGE)  # one read of the log's tail for its caught-up followers

    # -- stream ----------------------------------------------------------------------------------

    def stream_config(self, replicas: int = 1) -> StreamConfig:
        """The configuration the store needs: the log is kept whole, nothing expires;
        ``replicas`` copies (3 on a cluster of three or more: it survives one node's loss)."""
        return StreamConfig(
            name=self.stream,
            subjects=self.subjects,
            storage=StorageType.FILE,
            num_replicas=replicas,
            retention=RetentionPolicy.LIMITS,
            discard=DiscardPolicy.OLD,
            max_msgs=-1,
            max_bytes=-1,
            max_age=0,
            max_msgs_per_subject=-1,
            deny_delete=True,
            deny_purge=True,
            allow_atomic=True,
            allow_direct=True,
            # Per-message TTLs, for the managers' lease only (services.manager.leadership): a
            # message without a Nats-TTL header never expires.
            allow_msg_ttl=True,
            duplicate_window=self.duplicate_window,
        )

    async def ensure_stream(self, replicas: int | None = None) -> None:
        """Create the stream if missing (file storage, deny delete/purge, atomic batches on,
        ``replicas`` copies: by default 3 when the server is one of a cluster of three or more,
        else 1); of an existing one, verify every setting that keeps the log whole (its
        replicas only when ``replicas`` is given).

        Never updates a stream: an update is a way to erase the log (``max_msgs: 1``), so no
        Hoist role may send one. A difference is a StoreError naming each setting, both values
        and what to do."""
        want = self.stream_config(replicas or cluster_replicas(self.nc))
        try:
            info = await self.js.stream_info(self.stream)
        except NotFoundError:
            await self.js.add_stream(want)
            self.msg_ttl = True
            return
        # A stream made before leases existed takes no TTL: one manager leads it unleased.
        self.msg_ttl = bool(info.config.allow_msg_ttl)
        if replicas is None:
            want.num_replicas = info.config.num_replicas
        differs = _stream_differences(info.config, want)
        if differs:
            raise StoreError(
                f"stream {self.stream} is not the append-only log the event store needs: "
                + "; ".join(differs)
                + ". Hoist creates the stream only when it is absent and never changes it (no"
                " Hoist role may: an update could erase the log). Change it with the server's"
                " operator access (nats-server on its store dir, e.g. `nats stream edit"
                f" {self.stream}`), or point Hoist at a new stream"
            )

    # -- append ----------------------------------------------------------------------------------

    async def append(
        self,
        writes: Sequence[Write],
        *,
        idempotency_key: str | None = None,
        urgent: bool = False,
    ) -> list[int]:
        """Append all messages of all writes, all or nothing; return their stream sequences.

        ``urgent``: sent at once, not queued behind the requests in flight (a lease renewal
        must not wait out a burst of appends).

        One message: a plain publish with ``Nats-Expected-Last-Subject-Sequence``.  More: one
        atomic batch (also across subjects).  ``idempotency_key`` (a command's request id)
        becomes ``Nats-Msg-Id`` so a retried command appends nothing twice and gets back the
        original sequences.  Raises ConcurrencyError on a sequence conflict.
        """
        out: list[tuple[str, bytes, dict[str, str]]] = []
        moving: tuple[int, dict[str, str]] | None = None  # a check_only write: where, headers
        for i, write in enumerate(writes):
            if not write.messages:
                raise ValueError(f"writes[{i}] ({write.subject}) has no messages")
            expected = write.expected_last_seq
            if expected is not None and (type(expected) is not int or expected < 0):
                raise ValueError(
                    f"writes[{i}].expected_last_seq must be an int >= 0 or None, got {expected!r}"
                )
            if write.check_only and (
                expected is None or write.expected_subject is None or len(write.messages) != 1
            ):
                raise ValueError(
                    f"writes[{i}] is check_only: it must be one message checking another subject"
                    " (expected_last_seq and expected_subject)"
                )
            for j, message in enumerate(write.messages):
                headers = dict(message.headers)
                # The server checks the subject sequence on a subject's first message only.
                if j == 0 and expected is not None:
                    headers[EXPECTED_LAST_SUBJECT_SEQ] = str(expected)
                    if write.expected_subject is not None:
                        headers[EXPECTED_LAST_SUBJECT_SEQ_SUBJECT] = write.expected_subject
                # the first message keeps the idempotency key: no check moves from it
                if write.check_only and moving is None and out:
                    moving = (len(out), headers)
                out.append((write.subject, message.data, headers))
        if not out:
            return []
        check_moved = _move_check(out, moving)
        if len(out) > MAX_BATCH:
            raise LimitError(
                f"one append holds at most {MAX_BATCH} messages (a JetStream atomic batch),"
                f" got {len(out)}: split the command into smaller ones",
                "messages",
            )
        if idempotency_key is not None:
            if idempotency_key.split() != [idempotency_key]:  # empty, or has whitespace
                raise ValueError(
                    f"idempotency_key must be non-empty without whitespace, got {idempotency_key!r}"
                )
            out[0][2][MSG_ID] = idempotency_key
        self._check_limits(out)
        reply = await self._send(out, retry=idempotency_key is not None, urgent=urgent)
        error = reply.get("error")
        if error is None:
            last = reply["seq"]
            seqs = list(range(last - len(out) + 1, last + 1))
            for (subject, _, headers), seq in zip(out, seqs, strict=True):
                if MSG_TTL not in headers:  # an expiring message sets no floor: it may vanish
                    self._saw(subject, seq)
            return _with_moved(seqs, check_moved)
        code = error.get("err_code")
        moved = _WRONG_LAST.search(str(error.get("description", "")))
        if moved and len(writes) == 1 and writes[0].expected_subject is None:
            # the subject's last sequence now, as the server says (with expected_subject it is
            # the other subject's)
            self._saw(writes[0].subject, int(moved.group(1)))
        if code in WRONG_LAST or code == ERR_BATCH_DUPLICATE_MSG_ID:
            if idempotency_key is not None:
                original = await self._original_seqs(writes[0], idempotency_key, len(out))
                if original is not None:
                    return _with_moved(original, check_moved)
            if code in WRONG_LAST:
                raise await self._conflict(writes, error.get("description", ""))
            raise StoreError(
                f"idempotency key {idempotency_key!r} was already used by another command"
                f" (not on {writes[0].subject}): use a new request id for a new command"
            )
        refused = (
            f"JetStream refused the append to {out[0][0]}"
            f"{f' and {len(out) - 1} more messages' if len(out) > 1 else ''}:"
            f" {error.get('description')} (err_code {code})"
        )
        if error.get("code") == _UNAVAILABLE:
            raise StoreUnavailable(refused, stored=False)
        raise StoreError(refused)

    @property
    def max_subject_bytes(self) -> int:
        """The longest subject (UTF-8 bytes) the store appends to: the line that publishes a
        message must fit nats-server's ``MAX_CONTROL_LINE`` with the request's reply subject
        and the sizes (as many digits as the server's max_payload)."""
        max_payload = self.nc.max_payload
        # Kept per max_payload (a reconnect may bring another server's): making an inbox for
        # its length each append cost more than the rest of the checks together.
        if self._max_subject is None or self._max_subject[0] != max_payload:
            sizes = 2 * (1 + len(str(max_payload)))
            room = MAX_CONTROL_LINE - (1 + len(self.nc.new_inbox()) + _REQUEST_TOKEN) - sizes
            self._max_subject = (max_payload, room)
        return self._max_subject[1]

    def _check_limits(self, out: list[tuple[str, bytes, dict[str, str]]]) -> None:
        """LimitError for a message the server would refuse, or close the connection for."""
        max_payload, max_subject = self.nc.max_payload, self.max_subject_bytes
        batch = _BATCH_HEADER_BYTES if len(out) > 1 else 0
        for i, (subject, data, headers) in enumerate(out):
            # A character is at most 4 bytes in UTF-8: a message within every limit at that
            # size needs no exact count (no encoded copy of its subject and each header).
            most = _quick_header_bound(headers) + batch
            if (
                4 * len(subject) <= max_subject
                and most <= MAX_HEADERS
                and most + len(data) <= max_payload
            ):
                continue
            where = f"message {i + 1} of {len(out)} ({_shown(subject)})"
            length = len(subject.encode())
            if length > max_subject:
                raise LimitError(
                    f"{where}: its subject is {length} bytes, over the {max_subject} a NATS"
                    f" protocol line leaves for it (max_control_line {MAX_CONTROL_LINE}): nothing"
                    " was sent; use a shorter subject",
                    "subject",
                )
            header_bytes = _header_bytes(headers) + batch
            if header_bytes > MAX_HEADERS:
                raise LimitError(
                    f"{where}: its headers take {header_bytes} bytes, over JetStream's"
                    f" {MAX_HEADERS}: nothing was sent",
                    "headers",
                )
            if header_bytes + len(data) > max_payload:
                raise LimitError(
                    f"{where}: it takes {header_bytes + len(data)} bytes with its headers, over"
                    f" the server's max_payload of {max_payload}: nothing was sent",
                    "max_payload",
                )

    async def _send(
        self, out: list[tuple[str, bytes, dict[str, str]]], *, retry: bool, urgent: bool = False
    ) -> dict[str, Any]:
        """The stream's answer to the append; with ``retry`` (an idempotent append: it carries
        a key) sent again while unanswered, for a cluster electing a new stream leader after
        a node's loss (seconds) or a connection moving to another node."""
        for pause in (*(_ELECTION_PAUSES if retry else ()), None):
            try:
                async with contextlib.nullcontext() if urgent else self._slots:
                    if len(out) == 1:
                        subject, data, headers = out[0]
                        reply = await self._request(subject, data, headers)
                    else:
                        reply = await self._publish_batch(out)
                if pause is None or (reply.get("error") or {}).get("code") != _UNAVAILABLE:
                    return reply
            except StoreError:
                if pause is None:
                    raise
            except nats.errors.ConnectionReconnectingError:
                if pause is None:
                    raise StoreUnavailable(
                        f"no NATS connection for the append to {out[0][0]} (reconnecting)",
                        stored=False,
                    ) from None
            await asyncio.sleep(pause)
        raise AssertionError("unreachable: the last pause is None")

    async def _request(self, subject: str, data: bytes, headers: dict[str, str]) -> dict[str, Any]:
        try:
            msg = await self.nc.request(subject, data, timeout=self.timeout, headers=headers)
        except NoRespondersError:
            raise await self._no_responders(subject) from None
        except NatsTimeoutError:
            raise StoreUnavailable(
                f"JetStream did not acknowledge the append to {subject} in {self.timeout}s",
                stored=True,
            ) from None
        reply: dict[str, Any] = json.loads(msg.data)
        return reply

    async def _no_responders(self, subject: str) -> StoreError:
        """Why no stream took an append to ``subject`` (nothing was stored): the stream is
        missing, or it has no leader (a replicated stream electing one takes nothing for a
        few seconds after a node's loss; one that lost its quorum, nothing until it heals)."""
        missing = StoreError(
            f"no stream takes {subject}: call ensure_stream() first (stream {self.stream},"
            f" subjects {self.subjects})"
        )
        try:
            async with asyncio.timeout(self.timeout):  # not wait_for: see replay
                info = await self.js.stream_info(self.stream)
        except NotFoundError:
            return missing
        except (nats.errors.Error, TimeoutError) as e:  # the meta layer has no leader either
            detail = f"JetStream did not say where stream {self.stream} is: {e!r}"
        else:
            if not any(_subject_matches(f, subject) for f in info.config.subjects or ()):
                return missing
            leader = info.cluster.leader if info.cluster else None
            detail = f"its leader is {leader}" if leader else "it has no leader"
        return StoreUnavailable(
            f"stream {self.stream} did not take the append to {subject}: it has no leader now (a"
            f" cluster electing one, or without a quorum of its nodes; {detail})",
            stored=False,
        )

    async def _publish_batch(self, out: list[tuple[str, bytes, dict[str, str]]]) -> dict[str, Any]:
        # nats-py has no batch helper: the middle messages go as core publishes (the server
        # stages them), the last one carries the commit and is a request for the PubAck.
        batch_id = uuid.uuid4().hex
        last = len(out)
        for i, (subject, data, headers) in enumerate(out, 1):
            headers[BATCH_ID] = batch_id
            headers[BATCH_SEQ] = str(i)
            if i == last:
                headers[BATCH_COMMIT] = "1"
                return await self._request(subject, data, headers)
            await self.nc.publish(subject, data, headers=headers)
        raise AssertionError("unreachable: out is not empty")

    async def _original_seqs(self, first: Write, key: str, count: int) -> list[int] | None:
        """The sequences of an earlier append of the same command, None if there was none."""
        if first.expected_last_seq is not None:
            # The original, if any, is the first message after the expected one on the subject.
            after = first.expected_last_seq
            found = await self._fresh(
                first.subject,
                lambda: self._direct_get({"seq": after + 1, "next_by_subj": first.subject}),
                # Only "none after it" can be stale: a message found is the answer, however
                # far the subject went on since.
                lambda msg: after if msg is None else self._floors.get(first.subject, msg.seq),
            )
        else:
            since = datetime.now(UTC) - timedelta(seconds=self.duplicate_window + 5)
            found = None
            for msg in await self._direct_batch(
                {"start_time": since.isoformat(), "next_by_subj": first.subject}
            ):
                if msg.headers.get(MSG_ID) == key:
                    found = msg
                    break
        if found is None or found.headers.get(MSG_ID) != key:
            return None
        start = found.seq
        if count > 1:
            last = await self._direct_get({"seq": start + count - 1})
            batch_id = found.headers.get(BATCH_ID)
            if (
                last is None
                or batch_id is None
                or last.headers.get(BATCH_ID) != batch_id
                or last.headers.get(BATCH_COMMIT) != "1"
            ):
                raise StoreError(
                    f"command {key!r} was already appended (from sequence {start}) with other"
                    f" messages than this retry's {count}: use a new request id for a new command"
                )
        return list(range(start, start + count))

    async def _conflict(self, writes: Sequence[Write], detail: str) -> ConcurrencyError:
        # The server does not say which subject moved: ask the stream's leader (a direct get
        # may be answered by a replica that has not seen the write we lost to), so the caller
        # knows what to reload, and the reload reads at least that far (its floor).
        checked = [w for w in writes if w.expected_last_seq is not None]
        lasts = await asyncio.gather(*(self._moved_to(w) for w in checked))
        for write, last in zip(checked, lasts, strict=True):
            subject = write.expected_subject or write.subject
            if write.expected_subject is None and not any(
                MSG_TTL in m.headers for m in write.messages
            ):  # a fence checks a lease, whose messages expire: no floor there
                self._saw(subject, last)
            if last != write.expected_last_seq:
                return ConcurrencyError(subject, write.expected_last_seq, detail)
        first = checked[0] if checked else writes[0]
        return ConcurrencyError(
            first.expected_subject or first.subject, first.expected_last_seq, detail
        )

    # -- read ------------------------------------------------------------------------------------

    async def head(self) -> int:
        """The stream's last sequence (0 while empty)."""
        return int((await self.js.stream_info(self.stream)).state.last_seq)

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

    async def _last_once(self, subject: str, urgent: bool = False) -> Recorded | None:
        # Raw, like the batches: the header block is read whole (see _stored).
        reply: asyncio.Future[tuple[bytes | None, bytes]] = (
            asyncio.get_running_loop().create_future()
        )

        def on_msg(block: bytes | None, data: bytes) -> None:
            if not reply.done():
                reply.set_result((block, data))

        inbox = await self.nc.reply_inbox(on_msg)

        # The subject in the request's own subject (as ADR-31 has it), unless that line would be
        # too long for the server (it would close the connection): then in the request body.
        request, body = f"{self._direct}.{subject}", b""
        if len(request.encode()) + len(inbox) + 3 > MAX_CONTROL_LINE:
            request, body = self._direct, json.dumps({"last_by_subj": subject}).encode()
        try:
            async with contextlib.nullcontext() if urgent else self._slots:
                await self.nc.publish(request, body, reply=inbox)
                async with asyncio.timeout(self.timeout):  # not wait_for: see replay
                    block, data = await reply
        except TimeoutError:
            raise self._no_direct_answer() from None
        finally:
            self.nc.end_reply(inbox)
        if block is not None and block.startswith(_NO_STATUS):
            return _stored(block, data).record
        code, description = _status_line(block or b"")
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

    async def _moved_to(self, write: Write) -> int:
        """Where the subject ``write`` expected is now: a direct get (one round trip, any
        replica), and only where that says it did not move, the stream's leader (a lagging
        replica answers from before the write this one lost to)."""
        subject = write.expected_subject or write.subject
        last = await self._last(subject)
        if last is not None and last.seq > (write.expected_last_seq or 0):
            return last.seq  # moved on: a replica has it, so the leader has at least as much
        return await self._leader_last_seq(subject)

    async def _leader_last_seq(self, subject: str) -> int:
        """The subject's last sequence as the stream's leader has it (0: none); not a direct
        get, which any replica may answer."""
        try:
            return int((await self.js.get_msg(self.stream, subject=subject)).seq or 0)
        except NotFoundError:
            return 0
        except (nats.errors.Error, TimeoutError) as e:
            raise StoreUnavailable(
                f"stream {self.stream} did not say where {subject} is: {e}", stored=None
            ) from None

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
                if block.startswith(_NO_STATUS):  # a stored message
                    record = _stored(block, data)
                    pending = record.pending
                    out.append(record.record)
                else:  # end of batch (204), nothing found (404), or an error status
                    code, description = _status_line(block)
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
    ) -> AsyncIterator[Recorded]:
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
    ) -> AsyncIterator[list[Recorded]]:
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


def _move_check(
    out: list[tuple[str, bytes, dict[str, str]]], moving: tuple[int, dict[str, str]] | None
) -> tuple[int, int] | None:
    """Move a check_only write's check onto a message that checks nothing itself, dropping the
    write's own message; (where that message was, where its check went), or None when no
    message can carry it (the write is stored as it is)."""
    if moving is None:
        return None
    at, headers = moving
    check = {k: headers[k] for k in (EXPECTED_LAST_SUBJECT_SEQ, EXPECTED_LAST_SUBJECT_SEQ_SUBJECT)}
    for i, (_, _, carrier) in enumerate(out):
        if EXPECTED_LAST_SUBJECT_SEQ not in carrier:  # the check_only write's own has its check
            carrier.update(check)
            del out[at]
            return at, i - (i > at)
    return None


def _with_moved(seqs: list[int], moved: tuple[int, int] | None) -> list[int]:
    """One sequence per message of the writes: a moved check_only write gets its carrier's."""
    if moved is None:
        return seqs
    at, carrier = moved
    return [*seqs[:at], seqs[carrier], *seqs[at:]]


def _subject_matches(pattern: str, subject: str) -> bool:
    """``subject`` is one of those ``pattern`` (``*`` a token, ``>`` the rest) stands for."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def _header_bytes(headers: Mapping[str, str]) -> int:
    """The size of the header block nats-py sends for ``headers``, empty or not (at most: it
    strips names and values)."""
    return len(_NO_STATUS) + 2 + sum(len(f"{k}: {v}\r\n".encode()) for k, v in headers.items())


def _quick_header_bound(headers: Mapping[str, str]) -> int:
    """At least ``_header_bytes(headers)``, counted without encoding: 4 bytes a character."""
    chars = sum(map(len, headers)) + sum(map(len, headers.values()))
    return len(_NO_STATUS) + 2 + 4 * chars + 4 * len(headers)  # ": " and CRLF each


def _shown(subject: str) -> str:
    return subject if len(subject) <= 80 else f"{subject[:80]}... ({len(subject)} characters)"


def _seq_or_zero(record: Recorded | None) -> int:
    return 0 if record is None else record.seq


def _from_direct(msg: Msg) -> Recorded:
    return _record(dict(msg.headers or {}), msg.data)


def _status_line(block: bytes) -> tuple[str, str]:
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
    headers = parse_header_lines(block[len(_NO_STATUS) :])
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


# Every setting that decides whether the stream keeps each event for ever, answers the store's
# reads and takes its atomic, deduplicated appends. (name, default when the server omits it)
_VERIFIED: tuple[tuple[str, Any], ...] = (
    ("subjects", None),
    ("storage", None),
    ("retention", None),
    ("discard", None),
    ("max_msgs", -1),
    ("max_bytes", -1),
    ("max_age", 0),
    ("max_msgs_per_subject", -1),
    ("num_replicas", 1),
    ("deny_delete", False),
    ("deny_purge", False),
    ("allow_rollup_hdrs", False),  # a rollup header purges a subject or the whole stream
    ("sealed", False),
    ("mirror", None),  # a mirror takes no appends
    ("allow_atomic", False),
    ("allow_direct", False),
    ("duplicate_window", None),
)


def _stream_differences(have: StreamConfig, want: StreamConfig) -> list[str]:
    """``"<setting> is <have>, needs <want>"`` for every verified setting that differs."""
    out = []
    for name, default in _VERIFIED:
        got, need = _norm(getattr(have, name), default), _norm(getattr(want, name), default)
        if got != need:
            out.append(f"{name} is {_show(got)}, needs {_show(need)}")
    return out


def _show(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _norm(value: Any, default: Any = None) -> Any:
    if isinstance(value, Enum):  # the server's answer may hold the plain string
        return value.value
    if isinstance(value, list):
        return sorted(value)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def event_store(nc: Client) -> EventStore:
    """Hoist's event stream (domain.subjects) on ``nc``."""
    return EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
