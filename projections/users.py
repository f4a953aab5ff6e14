"""Hoist users (domain.user) as the log records them: one row per user, its latest standing.

The query handlers decide who may read what from this model (an enabled user reads their own
rows, an admin user every owner's), so the process that serves queries needs no fold of the
manager's: ``standing`` answers from the fold in memory, which is at or ahead of the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import duckdb

from domain import events as ev
from projections.base import Projection, fetch_rows
from projections.table import Row, Table

USERS = Table(
    "users",
    (
        ("name", "VARCHAR"),
        ("admin", "BOOLEAN"),
        ("enabled", "BOOLEAN"),
        ("changed_by", "VARCHAR"),  # who added or disabled them last
        ("created_at", "TIMESTAMPTZ"),
        ("updated_at", "TIMESTAMPTZ"),
        ("last_seq", "BIGINT"),
    ),
    key=("name",),
)


class UsersProjection(Projection):
    name: ClassVar[str] = "users"
    version: ClassVar[int] = 1
    tables: ClassVar[tuple[Table, ...]] = (USERS,)

    def __init__(self) -> None:
        super().__init__()
        self.users: dict[str, Row] = {}  # few, and any of them can change
        self.handlers = {ev.UserAdded: self._added, ev.UserDisabled: self._disabled}

    def load(self, cur: duckdb.DuckDBPyConnection, names: Mapping[str, str]) -> None:
        self.users = {r["name"]: r for r in fetch_rows(cur, f"SELECT * FROM {names['users']}")}

    def standing(self, name: str) -> tuple[bool, bool]:
        """(enabled, admin) of ``name`` as folded so far; a user never added is neither."""
        row = self.users.get(name)
        if row is None or not row["enabled"]:
            return False, False
        return True, bool(row["admin"])

    def _added(self, e: ev.UserAdded, seq: int) -> None:
        row = self.users.get(e.originator_id)
        fresh = row is None and e.originator_id not in self.changes["users"].rows
        if row is None:
            row = self.users[e.originator_id] = {"name": e.originator_id, "created_at": e.timestamp}
        row.update(admin=e.admin, enabled=True, changed_by=e.by, updated_at=e.timestamp)
        row["last_seq"] = seq
        self.put("users", e.originator_id, row, fresh=fresh)

    def _disabled(self, e: ev.UserDisabled, seq: int) -> None:
        row = self.users.get(e.originator_id)
        if row is None:
            return  # the domain disables only a user it has added: never recorded
        row.update(enabled=False, changed_by=e.by, updated_at=e.timestamp, last_seq=seq)
        self.put("users", e.originator_id, row)
