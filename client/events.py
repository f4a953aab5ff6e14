"""One recorded event as plain data: what `hoist history --json` prints and the web view's
audit rows show, decoded the way every reader of the log decodes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from domain import codec, subjects
from domain.admission import Inadmissible, admit, writer
from eventstore.store import Recorded

_ENVELOPE = ("type", "originator_id", "originator_version", "timestamp", "originator_topic")


def describe(rec: Recorded, quarantined: Mapping[int, str] | None = None) -> dict[str, Any]:
    """One event as data; ``quarantined``: seq -> reason of the records the read models
    skipped (an event can decode and still not apply: it says so too)."""
    kind, _, agg_id = rec.subject.removeprefix(subjects.EVENTS + ".").partition(".")
    actor = rec.headers.get(codec.ACTOR_HEADER, "-")
    out: dict[str, Any] = {
        "seq": rec.seq,
        "time": rec.time.isoformat(),
        "aggregate": kind,
        "id": agg_id,
        "type": None,
        "actor": actor,
        "writer": writer(rec.subject),
        "quarantined": None,
        "data": None,
    }
    try:
        event = admit(rec.subject, rec.headers, rec.data)
    except Inadmissible as e:  # history shows what every reader skipped, and who wrote it
        out.update(type=e.event_type or "?", quarantined=str(e))
        return out
    out["type"] = type(event).__name__
    skipped = (quarantined or {}).get(rec.seq)
    if skipped is not None:
        out["quarantined"] = skipped
        return out
    out["data"] = {k: v for k, v in msgspec.to_builtins(event).items() if k not in _ENVELOPE}
    return out
