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

The reads (and the floors that keep them from going back in time) are eventstore.reads;
EventStore adds the stream and the appends to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

import nats.errors
from nats.js.api import (
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError

from domain import subjects
from eventstore.messages import (
    BATCH_COMMIT,
    BATCH_ID,
    BATCH_SEQ,
    ERR_BATCH_DUPLICATE_MSG_ID,
    ERR_WRONG_LAST_SEQUENCE,
    ERR_WRONG_LAST_SEQUENCE_CONSTANT,
    EXPECTED_LAST_SUBJECT_SEQ,
    EXPECTED_LAST_SUBJECT_SEQ_SUBJECT,
    MAX_BATCH,
    MAX_CONTROL_LINE,
    MAX_HEADERS,
    MSG_ID,
    MSG_TTL,
    WRONG_LAST,
    ConcurrencyError,
    LimitError,
    Message,
    Recorded,
    StoreError,
    StoreUnavailable,
    Write,
)
from eventstore.reads import NO_STATUS, PAGE, StoreReads, status_line
from eventstore.tail import SharedTail
from transport.client import Client, cluster_replicas

# The most the batch headers _publish_batch adds take (id, sequence up to MAX_BATCH, commit).
# The store's API, as the rest of Hoist imports it.
__all__ = [
    "BATCH_COMMIT",
    "BATCH_ID",
    "BATCH_SEQ",
    "ERR_BATCH_DUPLICATE_MSG_ID",
    "ERR_WRONG_LAST_SEQUENCE",
    "ERR_WRONG_LAST_SEQUENCE_CONSTANT",
    "EXPECTED_LAST_SUBJECT_SEQ",
    "EXPECTED_LAST_SUBJECT_SEQ_SUBJECT",
    "IN_FLIGHT",
    "MAX_BATCH",
    "MAX_CONTROL_LINE",
    "MAX_HEADERS",
    "MSG_ID",
    "MSG_TTL",
    "PAGE",
    "WRONG_LAST",
    "ConcurrencyError",
    "EventStore",
    "LimitError",
    "Message",
    "Recorded",
    "StoreError",
    "StoreUnavailable",
    "Write",
    "event_store",
]

_BATCH_HEADER_BYTES = sum(
    len(f"{name}: {value}\r\n")
    for name, value in ((BATCH_ID, "0" * 32), (BATCH_SEQ, str(MAX_BATCH)), (BATCH_COMMIT, "1"))
)
_HEADER_FRAME = len(b"NATS/1.0\r\n") + 2  # a header block's first line and its last CRLF
IN_FLIGHT = 64  # requests to the stream awaiting their answer (EventStore.__init__)
# An idempotent append unanswered (no stream leader yet, a connection moving) is sent again
# after these pauses: a cluster elects a new leader within seconds of a node's loss.
_ELECTION_PAUSES = (0.1, 0.25, 0.5, 1.0, 1.0, 2.0, 2.0)
_UNAVAILABLE = 503  # JetStream's answer while a stream (or the meta layer) has no leader
_WRONG_LAST = re.compile(r"wrong last sequence: (\d+)")


class EventStore(StoreReads):
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
            room = MAX_CONTROL_LINE - (1 + self.nc.reply_subject_max()) - sizes
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
        """The stream's JSON answer to one message sent as a request (the slot is held)."""
        try:
            block, body = await self._ask(subject, data, headers)
        except TimeoutError:
            raise StoreUnavailable(
                f"JetStream did not acknowledge the append to {subject} in {self.timeout}s",
                stored=True,
            ) from None
        if block is not None and not block.startswith(NO_STATUS):  # a status, no answer
            code, description = status_line(block)
            if code == "503":  # no responders: no stream takes the subject now
                raise await self._no_responders(subject)
            raise StoreError(
                f"the append to {subject} was answered status {code} {description}".strip()
            )
        reply: dict[str, Any] = json.loads(body)
        return reply

    async def _no_responders(self, subject: str) -> StoreError:
        """Why no stream took an append to ``subject`` (nothing was stored): the stream is
        missing, or it has no leader (a replicated stream electing one takes nothing for a
        few seconds after a node's loss; one that lost its quorum, nothing until it heals)."""
        missing = StoreError(
            f"no stream takes {subject}: call ensure_stream() first (stream {self.stream},"
            f" subjects {self.subjects})"
        )
        if not self.nc.in_log_account:  # an agent's account: no JetStream API to ask
            return self._leaderless(subject, "this connection's account cannot ask where it is")
        try:
            async with asyncio.timeout(self.timeout):  # not wait_for: see replay
                info = await self.js.stream_info(self.stream)
        except NotFoundError:
            return missing
        except (nats.errors.Error, TimeoutError) as e:  # the meta layer has no leader either
            return self._leaderless(
                subject, f"JetStream did not say where stream {self.stream} is: {e!r}"
            )
        if not any(_subject_matches(f, subject) for f in info.config.subjects or ()):
            return missing
        leader = info.cluster.leader if info.cluster else None
        detail = f"its leader is {leader}" if leader else "it has no leader"
        return self._leaderless(subject, detail)

    def _leaderless(self, subject: str, detail: str) -> StoreUnavailable:
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
    return _HEADER_FRAME + sum(len(f"{k}: {v}\r\n".encode()) for k, v in headers.items())


def _quick_header_bound(headers: Mapping[str, str]) -> int:
    """At least ``_header_bytes(headers)``, counted without encoding: 4 bytes a character."""
    chars = sum(map(len, headers)) + sum(map(len, headers.values()))
    return _HEADER_FRAME + 4 * chars + 4 * len(headers)  # ": " and CRLF each


def _shown(subject: str) -> str:
    return subject if len(subject) <= 80 else f"{subject[:80]}... ({len(subject)} characters)"


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
