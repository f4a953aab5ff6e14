"""The read models: the projection runner over the event log and the query handlers, on one
DuckDB file (DuckDB has one writer per file, so the process that writes the models also answers
the queries).  They run in the manager's child process (read_models_process), or in the
manager's own with ``--read-models-in-process``.  The models come from the event log only; the
agents query's ``last_heartbeat_at`` comes from ``last_heartbeat`` (the heartbeats the child
hears, or the manager's liveness watcher)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import duckdb
from nats.aio.subscription import Subscription

from eventstore.bulk import BulkReader
from eventstore.store import EventStore
from projections import ALL
from projections.runner import Runner
from services.manager.admin_sql import DEFAULT_MEMORY, lock_down
from services.manager.queries import LastHeartbeat, no_heartbeats, serve_queries
from transport.client import Client
from transport.connection import unsubscribe_all
from transport.tasks import Tasks

IN_MEMORY = ":memory:"
# Kept beside the models by manager versions before heartbeats left the read models: stale.
_DROPPED = ("agent_heartbeats",)


class ReadModels:
    """``await ReadModels(nc, store, path).start()`` ... ``await read_models.stop()``;
    ``last_heartbeat``: the liveness watcher's ``last_heartbeat_at`` (without it the agents
    query says null); ``share_tail``: follow the log through the store's shared tail (in the
    manager's process, whose fleet follows it too), not alone (the child's, projections.runner)."""

    def __init__(
        self,
        nc: Client,
        store: EventStore,
        path: Path | str = IN_MEMORY,
        bulk: BulkReader | None = None,
        *,
        last_heartbeat: LastHeartbeat = no_heartbeats,
        share_tail: bool = True,
        threads: int = 1,
        sql_memory: int = DEFAULT_MEMORY,
    ) -> None:
        self.nc = nc
        self.share_tail = share_tail
        self.store = store
        self.bulk = bulk
        self.path = str(path)
        self.last_heartbeat = last_heartbeat
        self.threads = threads
        self.sql_memory = sql_memory  # admin SQL's memory cap (services.manager.admin_sql)
        self.runner: Runner | None = None
        self._con: duckdb.DuckDBPyConnection | None = None
        self._subs: list[Subscription] = []
        self._tasks = Tasks()

    async def start(self) -> None:
        if self.path != IN_MEMORY:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            # DuckDB takes every core by default, at each commit too: on a host shared with
            # nats-server and the manager, the creates in flight wait (bench/lifecycle.py).
            self._con = duckdb.connect(self.path, config={"threads": self.threads})
        except duckdb.IOException as e:  # another process holds its lock
            raise ValueError(
                f"the read models file {self.path} is in use ({str(e).splitlines()[0]}): is another"
                " manager running on this data dir? Stop it, or give this one --read-models"
                " another file"
            ) from None
        for table in _DROPPED:
            self._con.execute(f"DROP TABLE IF EXISTS {table}")
        lock_down(self._con)  # admin SQL reads this instance: no files, network, extensions
        # Twice (not reproduced since) a query's first TIMESTAMPTZ, read in a worker thread,
        # failed as DuckDB found "Time zone 'Etc/UTC' not available to Python's zoneinfo": a
        # lazy import racing another thread's is the likely cause. Have it done here, once.
        self._con.execute("SELECT TIMESTAMPTZ '2000-01-01 00:00:00+00'").fetchall()
        self.runner = Runner(self._con, self.store, ALL, bulk=self.bulk, share=self.share_tail)
        self._tasks.spawn(self.runner.serve(), name="projections")
        self._subs = await serve_queries(
            self.nc,
            self.runner,
            tasks=self._tasks,
            last_heartbeat=self.last_heartbeat,
            sql_memory=self.sql_memory,
        )

    async def stop(self) -> None:
        await unsubscribe_all(self._subs)
        await self._tasks.stop()
        if self._con is not None:
            await _close(self._con)
        self._subs, self._con = [], None


async def _close(con: duckdb.DuckDBPyConnection, within_s: float = 30.0) -> None:
    """Close ``con`` once the runner's last write is done: a cancelled task does not stop the
    thread committing its batch, and DuckDB refuses to close a busy connection (no waiting)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        try:
            con.close()
            return
        except duckdb.Error:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.02)
