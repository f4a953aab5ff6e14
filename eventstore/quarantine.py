"""Logging a quarantined record once per process, whichever reader met it.

Every reader skips what domain.admission refuses; the projection runner also records it in
the ``quarantine`` read model.  A record is met again on every reload, replay and retry, so
each (subject, sequence) is logged once: the log says a poison event exists, not how often it
was read.  And at most LINES_PER_MINUTE of them a minute, the rest counted in one line: a
flood of garbage (or a restart re-reading a log that holds much of it) cannot fill the disk
with log lines; the ``quarantine`` read model has every one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from domain.codec import ACTOR_HEADER, TYPE_HEADER

log = logging.getLogger("hoist.quarantine")

_MAX_SEEN = 100_000  # beyond this many distinct poison records, log them all again: memory
_seen: set[tuple[str, int]] = set()
LINES_PER_MINUTE = 20
_window = [0.0, 0, 0]  # start of the current minute, lines logged in it, lines held back
_total = [0]  # distinct records quarantined in this process (the metric; again after a clear)


def total() -> int:
    """How many distinct records this process's readers quarantined (hoist_quarantined_events)."""
    return _total[0]


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
    _total[0] += 1
    if not _may_log(time.monotonic()):
        return
    log.warning(
        "event %s on %s quarantined by the %s: %s (type %r, actor %r): skipped",
        seq,
        subject,
        reader,
        reason,
        headers.get(TYPE_HEADER, "")[:200],
        headers.get(ACTOR_HEADER, "")[:200],
    )


def _may_log(now: float) -> bool:
    start, held = _window[0], _window[2]
    if now - start >= 60.0:
        if held:
            log.warning(
                "%s more events quarantined in the last minute: hoist query quarantine lists them",
                held,
            )
        _window[:] = [now, 0, 0]
    if _window[1] >= LINES_PER_MINUTE:
        _window[2] += 1
        return False
    _window[1] += 1
    return True
