"""The event store on JetStream: asyncio API for the services (CONTRACT: implement the bodies).

One stream (file storage, deletes and purges denied), one subject per aggregate.  Values of
"sequence" are always *stream* sequences; aggregate versions are the callers' business.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from nats.aio.client import Client


@dataclass(frozen=True, slots=True)
class Message:
    """One message to append: payload bytes and headers (event type, schema version, ...)."""

    data: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Write:
    """Messages for one subject, appended only if that subject's last stream sequence is still
    ``expected_last_seq`` (0 = the subject is empty; None = no check)."""

    subject: str
    messages: Sequence[Message]
    expected_last_seq: int | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """A message as stored: its stream sequence, subject, headers, payload, and store time."""

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


class EventStore:
    """Append and read messages of one JetStream stream."""

    def __init__(self, nc: Client, stream: str, subjects: Sequence[str]) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.stream = stream
        self.subjects = list(subjects)

    async def ensure_stream(self) -> None:
        """Create the stream if missing (file storage, deny delete/purge, atomic batches on)."""
        raise NotImplementedError

    async def append(
        self, writes: Sequence[Write], *, idempotency_key: str | None = None
    ) -> list[int]:
        """Append all messages of all writes, all or nothing; return their stream sequences.

        One message: a plain publish with ``Nats-Expected-Last-Subject-Sequence``.  More: one
        atomic batch (also across subjects).  ``idempotency_key`` (a command's request id)
        becomes ``Nats-Msg-Id`` so a retried command appends nothing twice and gets back the
        original sequences.  Raises ConcurrencyError on a sequence conflict.
        """
        raise NotImplementedError

    async def last_seq(self, subject: str) -> int:
        """The stream sequence of the subject's last message, 0 if it has none."""
        raise NotImplementedError

    async def read_subject(self, subject: str, after_seq: int = 0) -> list[Recorded]:
        """One aggregate's history in order (messages with seq > after_seq)."""
        raise NotImplementedError

    def replay(
        self,
        *,
        from_seq: int = 1,
        until_seq: int | None = None,
        subject_filter: str | None = None,
        follow: bool = False,
    ) -> AsyncIterator[Recorded]:
        """Every message from ``from_seq`` in stream order; stops when caught up (or at
        ``until_seq``) unless ``follow``, then waits for new ones."""
        raise NotImplementedError
