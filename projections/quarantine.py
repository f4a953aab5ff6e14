"""Quarantined events, and the runner's admission of each event into the models.

The ``quarantine`` table holds every record of the log the readers skip (domain.admission
refused it, it does not follow its aggregate's history, a read model could not fold or store
it), with why, who claims to have appended it (``actor``, the ``Hoist-Actor`` header) and who
can have (``writer``, from the subject and the NATS grants).

This projection is also the runner's single authority on admission: it keeps each aggregate's
last admitted version (``aggregate_versions``, written with each batch, one row per aggregate
touched) and refuses an event out of sequence with the rule every reader applies
(domain.admission.out_of_sequence): an aggregate's first event must be one that starts it, a
starting event may not come again (a prepull policy may be set again), and every later event
must be the last admitted version + 1.  A refused or otherwise
quarantined event leaves the version as it was, as the domain fold leaves its aggregate, so
the aggregate's next real event is still accepted.

The runner's Gatekeeper (projections.base): not dispatched by event type, the runner asks
``check`` before it dispatches an event, tells ``admitted`` after the models took it, and calls
``add`` for each record it skips.  Rebuilt
from the log like every model, so a rebuild shows the same rows (reasons come from the rule,
not from when a record was first met).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar

import duckdb

from domain.admission import out_of_sequence, standalone, writer
from domain.codec import ACTOR_HEADER, TYPE_HEADER
from domain.events import Event
from domain.limits import MAX_REASON, clip
from projections.base import MODEL_REASON, Gatekeeper
from projections.table import Changes, Table

QUARANTINE = Table(
    "quarantine",
    (
        ("seq", "BIGINT"),
        ("subject", "VARCHAR"),
        ("event_type", "VARCHAR"),  # the Hoist-Event header, as written (may be unknown)
        ("reason", "VARCHAR"),
        ("actor", "VARCHAR"),  # the Hoist-Actor header: who appended it, as it claims
        ("writer", "VARCHAR"),  # who can have: admission.writer (agent:<id>, manager, unknown)
        ("stored_at", "TIMESTAMPTZ"),  # when the stream stored it
    ),
)
# Each aggregate subject's last admitted originator_version.
AGGREGATE_VERSIONS = Table(
    "aggregate_versions", (("subject", "VARCHAR"), ("version", "BIGINT")), key=("subject",)
)
_HEADER_TEXT = 200  # header values are the writer's: keep what a human needs


class QuarantineProjection(Gatekeeper):
    name: ClassVar[str] = "quarantine"
    # 2: writer column, aggregate_versions (version gaps refused); 3: no lease rows
    version: ClassVar[int] = 3
    tables: ClassVar[tuple[Table, ...]] = (QUARANTINE, AGGREGATE_VERSIONS)

    def __init__(self) -> None:
        super().__init__()
        self.versions: dict[str, int] = {}  # subject -> last admitted version
        self._touched: set[str] = set()  # subjects whose version changed in this batch
        self._new: set[str] = set()  # ... and had none before it (no row to replace)

    def load(self, cur: duckdb.DuckDBPyConnection, names: Mapping[str, str]) -> None:
        self.versions = dict(
            cur.execute(f"SELECT subject, version FROM {names['aggregate_versions']}").fetchall()
        )
        self.refused = {
            seq
            for (seq,) in cur.execute(
                f"SELECT seq FROM {names['quarantine']} WHERE NOT starts_with(reason, ?)",
                [MODEL_REASON],
            ).fetchall()
        }
        self._touched, self._new = set(), set()

    def check(self, subject: str, event: Event) -> str | None:
        """Why ``event`` (admitted on ``subject``) cannot follow its aggregate's admitted
        events (domain.admission.out_of_sequence, the rule of every reader); None if it can."""
        return out_of_sequence(subject, self.versions.get(subject), event)

    def admitted(self, subject: str, event: Event) -> None:
        """``event`` passed ``check`` and the models took it: its aggregate is at its version.
        A standalone message (the managers' lease) has no version to keep: it expires, so a
        rebuild after it lapsed would not see it."""
        if standalone(subject):
            return
        if subject not in self.versions:
            self._new.add(subject)
        self.versions[subject] = event.originator_version
        self._touched.add(subject)

    def add(
        self, seq: int, subject: str, headers: Mapping[str, str], at: datetime, reason: str
    ) -> None:
        if not reason.startswith(MODEL_REASON):
            self.refused.add(seq)
        self.append(
            "quarantine",
            (
                seq,
                clip(subject, _HEADER_TEXT),
                clip(headers.get(TYPE_HEADER, ""), _HEADER_TEXT),
                clip(reason, MAX_REASON),
                clip(headers.get(ACTOR_HEADER, ""), _HEADER_TEXT),
                clip(writer(subject), _HEADER_TEXT),
                at,
            ),
        )

    def take_changes(self) -> dict[str, Changes]:
        versions = self.changes["aggregate_versions"]
        for subject in self._touched:  # one upsert per aggregate the batch touched
            row: dict[str, Any] = {"subject": subject, "version": self.versions[subject]}
            versions.rows[subject] = row
        versions.fresh |= self._new
        self._touched, self._new = set(), set()
        return super().take_changes()


def count(con: duckdb.DuckDBPyConnection) -> int:
    """How many records the read models quarantined (0 before the model exists)."""
    cur = con.cursor()
    try:
        return int(cur.execute("SELECT count(*) FROM quarantine").fetchall()[0][0])
    except duckdb.CatalogException:
        return 0
    finally:
        cur.close()
