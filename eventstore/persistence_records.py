"""How the eventsourcing persistence module's records lie on the stream, and their decoders.

Subjects ``es.<stream>.<kind>.<id token>`` (kind: ``events``, ``snapshots``, ``tracking`` or
another purpose); headers ``Es-Topic`` and ``Es-Version`` on events, ``Es-Tracking-Id`` on
tracking records.  Each decoder raises ValueError, naming what is wrong, for a poison message
(one that is no record of the module): readers skip it and quarantine it.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from uuid import UUID

from eventsourcing.persistence import Notification, StoredEvent

from eventstore.store import Recorded

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


def int_header(record: Recorded, name: str) -> int:
    raw = record.headers.get(name)
    if raw is None:
        raise ValueError(f"no {name} header")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} {raw[:40]!r} is not an integer") from None


def originator_id(record: Recorded) -> UUID | str:
    parts = record.subject.split(".")
    if len(parts) != 4:
        raise ValueError("the subject is not es.<stream>.<kind>.<id token>")
    try:
        found = token_id(parts[3])
    except ValueError:  # base64 and UTF-8 errors are ValueErrors too
        found = None
    # Only the token id_token() makes (base64 decoding skips stray characters).
    if found is None or id_token(found) != parts[3]:
        raise ValueError(f"{parts[3][:40]!r} is not an originator id token")
    return found


def topic(record: Recorded) -> str:
    value = record.headers.get(TOPIC)
    if not value:
        raise ValueError(f"no {TOPIC} header")
    return value


def stored_event(record: Recorded) -> StoredEvent:
    return StoredEvent(
        originator_id=originator_id(record),
        originator_version=int_header(record, VERSION),
        topic=topic(record),
        state=record.data,
    )


def notification(record: Recorded) -> Notification:
    return Notification(
        id=record.seq,
        originator_id=originator_id(record),
        originator_version=int_header(record, VERSION),
        topic=topic(record),
        state=record.data,
    )


def tracking_id(record: Recorded) -> int:
    return int_header(record, TRACKING_ID)
