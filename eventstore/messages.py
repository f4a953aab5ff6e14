"""What the event store takes and gives: the messages of an append (Message, Write), a
stored message (Recorded), the store's errors, and the JetStream limits, headers and err_codes
both its halves (eventstore.store, eventstore.reads) use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

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


class LimitError(ValueError):
    """An append the server would not take, refused before anything was sent: too many
    messages, a subject too long for a NATS protocol line, headers or a message too large.
    (nats-server closes the connection on a line or message over its limits.)

    ``limit``: which one ("messages", "subject", "headers", "max_payload")."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit
