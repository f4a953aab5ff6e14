"""Quarantined events: every record of the log the readers skip (domain.admission refused it,
a read model could not fold or store it), with why and who appended it.

Not dispatched by event type: the runner adds a row for each record it skips.  Rebuilt from
the log like every model, so a rebuild shows the same rows (reasons come from the rule, not
from when a record was first met).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import ClassVar

import duckdb

from domain.codec import ACTOR_HEADER, TYPE_HEADER
from domain.limits import MAX_REASON, clip
from projections.base import Projection
from projections.table import Table

QUARANTINE = Table(
    "quarantine",
    (
        ("seq", "BIGINT"),
        ("subject", "VARCHAR"),
        ("event_type", "VARCHAR"),  # the Hoist-Event header, as written (may be unknown)
        ("reason", "VARCHAR"),
        ("actor", "VARCHAR"),  # the Hoist-Actor header: who appended it, as it claims
        ("stored_at", "TIMESTAMPTZ"),  # when the stream stored it
    ),
)
_HEADER_TEXT = 200  # header values are the writer's: keep what a human needs


class QuarantineProjection(Projection):
    name: ClassVar[str] = "quarantine"
    version: ClassVar[int] = 1
    tables: ClassVar[tuple[Table, ...]] = (QUARANTINE,)

    def add(
        self, seq: int, subject: str, headers: Mapping[str, str], at: datetime, reason: str
    ) -> None:
        self.append(
            "quarantine",
            (
                seq,
                clip(subject, _HEADER_TEXT),
                clip(headers.get(TYPE_HEADER, ""), _HEADER_TEXT),
                clip(reason, MAX_REASON),
                clip(headers.get(ACTOR_HEADER, ""), _HEADER_TEXT),
                at,
            ),
        )


def count(con: duckdb.DuckDBPyConnection) -> int:
    """How many records the read models quarantined (0 before the model exists)."""
    cur = con.cursor()
    try:
        return int(cur.execute("SELECT count(*) FROM quarantine").fetchall()[0][0])
    except duckdb.CatalogException:
        return 0
    finally:
        cur.close()
