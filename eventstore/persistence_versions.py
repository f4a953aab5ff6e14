"""Which of an aggregate's records on the server are valid, for the reads of the persistence
module that do not come from its local copy.

The module's appends only ever add versions after an aggregate's last one, so a record whose
version is not after every earlier one of its subject was published around them: poison, which
every reader skips (the local copy decides the same as it applies the stream).  Deciding it
needs the versions before the record on its subject.  ``Versions`` keeps, per subject, its valid
records up to a sequence (``_Known``) and reads the subject's history only when that does not
reach far enough.  Most records need no read: the first message a module append puts on a
subject carries ``Nats-Expected-Last-Subject-Sequence``, which the server enforced, so it names
the subject's previous message (0: there was none); a scan in stream order (notifications, a
subscription) carries what it learned of each subject from one record to its next.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eventstore.persistence_records import stored_event
from eventstore.store import (
    EXPECTED_LAST_SUBJECT_SEQ,
    EXPECTED_LAST_SUBJECT_SEQ_SUBJECT,
    EventStore,
    Recorded,
)

KEPT = 10_000  # subjects whose valid records are remembered; the least recently used go first


@dataclass(slots=True)
class _Known:
    """A subject's valid records (sequences and versions, both ascending) among all of its
    records up to ``upto``."""

    upto: int = 0
    seqs: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def top(self, seq: int) -> tuple[int, int] | None:
        """(sequence, version) of the last valid record at or before ``seq``."""
        i = bisect.bisect_right(self.seqs, seq)
        return (self.seqs[i - 1], self.versions[i - 1]) if i else None


Scan = dict[str, _Known]  # what a scan in stream order learned of each subject it met


class Versions:
    """The valid records of the subjects the module reads from the server; on the module's
    event loop only (not thread-safe)."""

    def __init__(
        self,
        store: EventStore,
        quarantine: Callable[[Recorded, str], None],
        kept: int = KEPT,
    ) -> None:
        self.store = store
        self._quarantine = quarantine
        self._kept = kept
        self._known: dict[str, _Known] = {}  # least recently used first

    async def valid(self, record: Recorded, version: int, scan: Scan | None = None) -> bool:
        """Whether ``record``, a well-formed event or snapshot of ``version``, is after every
        earlier one of its subject (else it is quarantined).  ``scan``: the caller reads its
        subjects' messages in stream order and asks about each well-formed one."""
        known = await self._covering(record, version, scan)
        i = bisect.bisect_left(known.seqs, record.seq)
        return i < len(known.seqs) and known.seqs[i] == record.seq

    async def top(self, record: Recorded, version: int | None) -> tuple[int, int] | None:
        """(sequence, version) of the last valid record of ``record``'s subject at or before
        it (``version``: the record's, None if it is malformed)."""
        return (await self._covering(record, version)).top(record.seq)

    def appended(self, subject: str, expected_last_seq: int, seqs: Sequence[int],
                 versions: Sequence[int]) -> None:  # fmt: skip
        """The module appended these (valid) versions after ``expected_last_seq``."""
        known = self._known.get(subject)
        if expected_last_seq == 0:
            known = _Known()
        elif known is None or not expected_last_seq <= known.upto < seqs[0]:
            return  # what lies between is not known here
        known.seqs.extend(seqs)
        known.versions.extend(versions)
        known.upto = seqs[-1]
        self._keep(subject, known)

    async def _covering(
        self, record: Recorded, version: int | None, scan: Scan | None = None
    ) -> _Known:
        """What is known of ``record``'s subject, up to the record at least."""
        subject, seq = record.subject, record.seq
        known = scan.get(subject) if scan is not None else None
        if known is None:
            known = self._known.get(subject)
            if known is None or known.upto < seq:
                expected = _expected(record)
                if expected == 0:  # the server took it on an empty subject
                    known = _Known()
                elif expected is None or known is None or known.upto < expected:
                    known = await self._read(subject, known, seq)
                # else: the server took it right after ``expected``: nothing lies between
        # A scan's own record of the subject: it saw every message since, up to this one.
        if known.upto < seq:
            self._apply(known, record, version)
        self._keep(subject, known)
        if scan is not None:
            scan[subject] = known
        return known

    def _apply(self, known: _Known, record: Recorded, version: int | None) -> None:
        """``record`` follows everything ``known`` holds of its subject."""
        if version is not None:
            if not known.versions or version > known.versions[-1]:
                known.seqs.append(record.seq)
                known.versions.append(version)
            else:
                self._quarantine(record, f"version {version} is not after {known.versions[-1]}")
        known.upto = record.seq

    async def _read(self, subject: str, known: _Known | None, at_least: int) -> _Known:
        """``known`` (or all) of the subject, read on from the server up to ``at_least``."""
        after = known.upto if known is not None else 0
        records = await self.store.read_subject(subject, after, at_least=at_least)
        known = self._known.get(subject) if known is None else known  # another may have read
        if known is None:
            known = _Known()
        for record in records:
            if record.seq > known.upto:
                self._apply(known, record, self._version(record))
        return known

    def _version(self, record: Recorded) -> int | None:
        try:
            return stored_event(record).originator_version
        except ValueError as e:
            self._quarantine(record, str(e))
            return None

    def _keep(self, subject: str, known: _Known) -> None:
        self._known.pop(subject, None)  # re-inserted last: most recently used
        if len(self._known) >= self._kept:
            del self._known[next(iter(self._known))]
        self._known[subject] = known


def _expected(record: Recorded) -> int | None:
    """The subject's previous sequence as the server checked it when it took ``record``."""
    headers = record.headers
    if EXPECTED_LAST_SUBJECT_SEQ_SUBJECT in headers:
        return None  # the check was on another subject
    raw = headers.get(EXPECTED_LAST_SUBJECT_SEQ)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None
