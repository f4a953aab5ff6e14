"""The read models in the manager process: the projection runner over the event log, the
heartbeat listener, and the query handlers, on one DuckDB file (DuckDB has one writer per file,
so the process that writes the models also answers the queries)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import duckdb
from nats.aio.subscription import Subscription

from projections.heartbeats import listen_heartbeats
from projections.runner import Runner
from services.eventstore.bulk import BulkReader
from services.eventstore.store import EventStore
from services.manager.admin_sql import lock_down
from services.manager.queries import serve_queries
from services.transport.client import Client
from services.transport.tasks import Tasks

IN_MEMORY = ":memory:"


class ReadModels:
    """``await ReadModels(nc, store, path).start()`` ... ``await read_models.stop()``."""

    def __init__(
        self,
        nc: Client,
        store: EventStore,
        path: Path | str = IN_MEMORY,
        bulk: BulkReader | None = None,
    ) -> None:
        self.nc = nc
        self.store = store
        self.bulk = bulk
        self.path = str(path)
        self.runner: Runner | None = None
        self._con: duckdb.DuckDBPyConnection | None = None
        self._subs: list[Subscription] = []
        self._tasks = Tasks()

    async def start(self) -> None:
        if self.path != IN_MEMORY:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._con = duckdb.connect(self.path)
        lock_down(self._con)  # admin SQL reads this instance: no files, network, extensions
        self.runner = Runner(self._con, self.store, bulk=self.bulk)
        self._tasks.spawn(self.runner.serve(), name="projections")
        self._tasks.spawn(listen_heartbeats(self.nc, self.runner), name="heartbeats")
        self._subs = await serve_queries(self.nc, self.runner, tasks=self._tasks)

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
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
