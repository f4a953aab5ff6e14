"""Compare read models with a from-scratch rebuild: the audit behind `hoist verify`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from eventstore.bulk import BulkReader
from eventstore.store import EventStore
from projections import ALL
from projections.base import Projection, fetch_rows
from projections.runner import META, Runner

EXAMPLES = 5  # differing rows shown per table and side


@dataclass
class Difference:
    table: str
    only_live: int  # rows in the live model and not in the rebuild
    only_rebuilt: int
    examples_live: list[dict[str, Any]]
    examples_rebuilt: list[dict[str, Any]]


def snapshot(
    con: duckdb.DuckDBPyConnection, types: Sequence[type[Projection]] = ALL
) -> tuple[int, dict[str, pa.Table]]:
    """Every model table and the sequence they reflect, read in one transaction.  Raises
    ValueError if the models are at different sequences (a rebuild in progress)."""
    cur = con.cursor()
    cur.begin()
    try:
        seqs = dict(cur.execute(f"SELECT projection, seq FROM {META}").fetchall())
        missing = [t.name for t in types if t.name not in seqs]
        if missing:
            raise ValueError(f"no read model {', '.join(missing)} in this database yet")
        distinct = {seqs[t.name] for t in types}
        if len(distinct) != 1:
            raise ValueError(
                f"the read models are at different sequences {seqs} (a rebuild is running):"
                " verify again when it has finished"
            )
        tables = {
            t.name: cur.sql(f"SELECT * FROM {t.name}").to_arrow_table()
            for p in types
            for t in p.tables
        }
        return distinct.pop(), tables
    finally:
        cur.rollback()
        cur.close()


def compare(live: dict[str, pa.Table], rebuilt: duckdb.DuckDBPyConnection) -> list[Difference]:
    """Tables that differ, as multisets of rows (row order does not matter)."""
    out: list[Difference] = []
    cur = rebuilt.cursor()
    for name, table in live.items():
        cur.register("_live", table)
        try:
            only_live = fetch_rows(cur, f"SELECT * FROM _live EXCEPT ALL SELECT * FROM {name}")
            only_rebuilt = fetch_rows(cur, f"SELECT * FROM {name} EXCEPT ALL SELECT * FROM _live")
        finally:
            cur.unregister("_live")
        if only_live or only_rebuilt:
            out.append(
                Difference(
                    name,
                    len(only_live),
                    len(only_rebuilt),
                    only_live[:EXAMPLES],
                    only_rebuilt[:EXAMPLES],
                )
            )
    return out


async def verify(
    con: duckdb.DuckDBPyConnection,
    store: EventStore,
    bulk: BulkReader | None = None,
    types: Sequence[type[Projection]] = ALL,
) -> tuple[int, list[Difference]]:
    """Rebuild the models ``types`` in memory up to the sequence the live ones reflect and
    compare (reading through ``bulk`` if given, as the live runner does)."""
    seq, live = await asyncio.to_thread(snapshot, con, types)
    scratch = duckdb.connect()
    try:
        await Runner(scratch, store, types, bulk=bulk).run(follow=False, until_seq=seq)
        return seq, await asyncio.to_thread(compare, live, scratch)
    finally:
        scratch.close()
