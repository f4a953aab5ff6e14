"""Logging a quarantined record once per process, whichever reader met it.

Every reader skips what domain.admission refuses; the projection runner also records it in
the ``quarantine`` read model.  A record is met again on every reload, replay and retry, so
each (subject, sequence) is logged once: the log says a poison event exists, not how often it
was read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from domain.codec import ACTOR_HEADER, TYPE_HEADER

log = logging.getLogger("hoist.quarantine")

_MAX_SEEN = 100_000  # beyond this many distinct poison records, log them all again: memory
_seen: set[tuple[str, int]] = set()


def quarantined(
    seq: int, subject: str, headers: Mapping[str, str], reason: str, reader: str
) -> None:
    """Note that ``reader`` skipped the record at ``seq`` on ``subject`` because of ``reason``."""
    key = (subject, seq)
    if key in _seen:
        return
    if len(_seen) >= _MAX_SEEN:
        _seen.clear()
    _seen.add(key)
    log.warning(
        "event %s on %s quarantined by the %s: %s (type %r, actor %r): skipped",
        seq,
        subject,
        reader,
        reason,
        headers.get(TYPE_HEADER, "")[:200],
        headers.get(ACTOR_HEADER, "")[:200],
    )
