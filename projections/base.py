"""What every projection is: named tables with a schema version, an in-memory fold of events,
and the changes of the current batch, which the runner writes with the checkpoint; and what the
one projection that decides admission for the runner is (``Gatekeeper``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, ClassVar

import duckdb

from domain.events import Event
from projections.table import Changes, Row, Table

Handler = Callable[[Any, int], None]  # (event, stream sequence)
# Reasons the runner gives when a read model could not fold or store an admitted event (the
# other reasons are admission's refusals: the event reached no model).
MODEL_REASON = "read model "


class Projection:
    """Subclasses set ``name``, ``version`` (bump it when tables or fold change: the runner then
    rebuilds the model from the first event into fresh tables and swaps them in at once),
    ``tables`` and ``views``, and fill ``handlers`` in ``__init__``.

    ``load`` brings back from the committed tables whatever the fold keeps in memory (only the
    rows future events can still change), so a restarted runner continues where it committed.
    """

    name: ClassVar[str]
    version: ClassVar[int]
    tables: ClassVar[tuple[Table, ...]]
    views: ClassVar[Mapping[str, str]] = {}  # view name -> SELECT over base table names

    def __init__(self) -> None:
        self.seq = 0  # the last stream sequence folded (committed once the runner commits)
        # Event class -> fold; the runner calls the fold of each event it gets (exact class).
        self.handlers: dict[type[Event], Handler] = {}
        self.changes: dict[str, Changes] = {t.name: Changes() for t in self.tables}

    def load(self, cur: duckdb.DuckDBPyConnection, names: Mapping[str, str]) -> None:
        """Restore memory from the tables (``names``: base name -> physical name)."""

    def take_changes(self) -> dict[str, Changes]:
        """The batch's changes, handed to the writer; the next batch starts empty."""
        changes = self.changes
        self.changes = {t.name: Changes() for t in self.tables}
        return changes

    # -- helpers for the folds ------------------------------------------------------------------

    def put(self, table: str, key: Any, row: Row, *, fresh: bool = False) -> None:
        """Mark ``row`` changed; ``fresh`` says it did not exist before (nothing to delete)."""
        changes = self.changes[table]
        changes.rows[key] = row
        if fresh:
            changes.fresh.add(key)

    def delete(self, table: str, key: Any) -> None:
        self.changes[table].rows[key] = None

    def append(self, table: str, values: tuple[Any, ...]) -> None:
        """Add a row to an append-only table: its values in column order."""
        self.changes[table].appended.append(values)


class Gatekeeper(Projection):
    """A projection the runner asks about every record (at most one among its models: the
    quarantine model is it).  Not dispatched by event type: the runner asks ``check`` before
    it dispatches an admitted event, tells ``admitted`` after the models took it, and calls
    ``add`` for each record it skips (``reason`` starts with MODEL_REASON when a model could
    not fold or store it).  ``refused`` holds the records refused before reaching any model,
    so a model rebuilt behind the gatekeeper skips them without deciding again."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: set[int] = set()

    def check(self, subject: str, event: Event) -> str | None:
        """Why ``event`` (admitted on ``subject``) must not reach the models; None if it may."""
        raise NotImplementedError

    def admitted(self, subject: str, event: Event) -> None:
        """``event`` passed ``check`` and the models took it."""
        raise NotImplementedError

    def add(
        self, seq: int, subject: str, headers: Mapping[str, str], at: datetime, reason: str
    ) -> None:
        """Record ``seq`` skipped, and why."""
        raise NotImplementedError


def fetch_rows(
    cur: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None
) -> list[Row]:
    """Rows as dicts (column -> value)."""
    result = cur.execute(sql, params or [])
    names = [d[0] for d in result.description]
    return [dict(zip(names, values, strict=True)) for values in result.fetchall()]
