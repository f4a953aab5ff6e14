"""Prepull policies as the log records them: one row per policy, its latest version.

A removed policy keeps its row (``removed`` true, the removal's reason) so ``hoist query
policies`` shows what was there and why it went; a later PrepullPolicySet brings it back.
Resource groups and rules are JSON text (the rules as their events encode them, with ``kind``):
the query replies decode them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import duckdb
import msgspec

from domain import events as ev
from projections.base import Projection, fetch_rows
from projections.table import Row, Table

PREPULL_POLICIES = Table(
    "prepull_policies",
    (
        ("name", "VARCHAR"),
        ("resource_groups", "VARCHAR"),  # JSON list; empty: every group
        ("rules", "VARCHAR"),  # JSON list of rules
        ("priority", "BIGINT"),
        ("removed", "BOOLEAN"),
        ("reason", "VARCHAR"),  # of the latest set or removal
        ("created_at", "TIMESTAMPTZ"),
        ("updated_at", "TIMESTAMPTZ"),
        ("last_seq", "BIGINT"),
    ),
    key=("name",),
)
JSON_COLUMNS = ("resource_groups", "rules")


class PoliciesProjection(Projection):
    name: ClassVar[str] = "policies"
    version: ClassVar[int] = 2  # v2: built under the admission rule (domain.admission)
    tables: ClassVar[tuple[Table, ...]] = (PREPULL_POLICIES,)

    def __init__(self) -> None:
        super().__init__()
        self.policies: dict[str, Row] = {}  # few, and any of them can change
        self.handlers = {
            ev.PrepullPolicySet: self._set,
            ev.PrepullPolicyRemoved: self._removed,
        }

    def load(self, cur: duckdb.DuckDBPyConnection, names: Mapping[str, str]) -> None:
        rows = fetch_rows(cur, f"SELECT * FROM {names['prepull_policies']}")
        self.policies = {r["name"]: r for r in rows}

    def _set(self, e: ev.PrepullPolicySet, seq: int) -> None:
        row = self.policies.get(e.originator_id)
        fresh = row is None and e.originator_id not in self.changes["prepull_policies"].rows
        if row is None:
            row = self.policies[e.originator_id] = {
                "name": e.originator_id,
                "created_at": e.timestamp,
            }
        row.update(
            resource_groups=msgspec.json.encode(e.resource_groups).decode(),
            rules=msgspec.json.encode(e.rules).decode(),
            priority=e.priority,
            removed=False,
            reason=e.reason,
            updated_at=e.timestamp,
            last_seq=seq,
        )
        self.put("prepull_policies", e.originator_id, row, fresh=fresh)

    def _removed(self, e: ev.PrepullPolicyRemoved, seq: int) -> None:
        row = self.policies.get(e.originator_id)
        if row is None:
            return  # the domain removes only a policy it has set: never recorded
        row.update(removed=True, reason=e.reason, updated_at=e.timestamp, last_seq=seq)
        self.put("prepull_policies", e.originator_id, row)
