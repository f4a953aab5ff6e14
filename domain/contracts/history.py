"""A session's events for a Hoist user, who may not read the log itself.

``hoist.query.<user>.history`` (services.manager.history) takes ``{"session_id", "after_seq":
0, "wait_s": 0}`` and answers ``{"events": [{"seq", "subject", "time", "headers", "data"}],
"last_seq", "more"}``: the session's events after ``after_seq`` in order, at most
``MAX_EVENTS`` or about ``MAX_BYTES`` of them (``more``: ask again from the last one's seq), and
``last_seq``, the session's last event's seq when read.  ``wait_s`` (at most ``MAX_WAIT_S``)
holds an answer with no events until one comes: what ``hoist watch`` follows with.  ``data``
is the event's JSON as text, ``time`` ISO 8601.  Another user's session, or none, is
``not-found``; an admin user may read any session's.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from domain.limits import Id

MAX_EVENTS = 500
MAX_BYTES = 256 * 1024  # well under the NATS default max payload of 1 MiB
MAX_WAIT_S = 20.0


class SessionHistory(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    session_id: Id
    after_seq: Annotated[int, msgspec.Meta(ge=0)] = 0
    wait_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_WAIT_S)] = 0.0


class HistoryEvent(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    subject: str
    time: str
    headers: dict[str, str]
    data: str


class HistoryPage(msgspec.Struct, frozen=True, kw_only=True):
    events: list[HistoryEvent]
    last_seq: int
    more: bool = False
