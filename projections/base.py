"""What every projection is: named tables with a schema version, an in-memory fold of events,
and the changes of the current batch, which the runner writes with the checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import duckdb

from domain.events import Event
from projections.table import Changes, Row, Table

Handler = Callable[[Any, int], None]  # (event, stream sequence)


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


def fetch_rows(
    cur: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None
) -> list[Row]:
    """Rows as dicts (column -> value)."""
    result = cur.execute(sql, params or [])
    names = [d[0] for d in result.description]
    return [dict(zip(names, values, strict=True)) for values in result.fetchall()]
