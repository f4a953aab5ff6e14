"""The runner in its own process, SIGKILLed while it writes a DuckDB file, many times: the file
it leaves always reflects a whole number of batches, and the run that finishes equals a rebuild
from scratch."""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

import duckdb

from projections.runner import META
from projections.verify import compare, snapshot
from services.eventstore.repository import Repository
from services.eventstore.store import EventStore
from services.stack.natsserver import NatsServer
from tests.projections.conftest import rebuilt, scripted_history

# Small batches, each commit slowed a little, so a kill lands between and inside commits.
_RUNNER = """
import asyncio, sys, time, duckdb
from domain import subjects
from projections import ALL
from projections.runner import Runner
from services.transport.client import connect
from services.eventstore.store import EventStore

async def main(url, db):
    nc = await connect(url)
    store = EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
    runner = Runner(duckdb.connect(db), store, ALL, max_batch=7, fault=lambda p: time.sleep(0.002))
    print("started", flush=True)
    await runner.run(follow=False)
    print("done", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _checkpoints(db: Path) -> list[int]:
    con = duckdb.connect(str(db))
    try:
        return [r[0] for r in con.execute(f"SELECT seq FROM {META}").fetchall()]
    finally:
        con.close()


async def test_a_runner_sigkilled_mid_batch_many_times_ends_identical_to_a_rebuild(
    nats_server: NatsServer, store: EventStore, repo: Repository, tmp_path: Path
) -> None:
    last = await scripted_history(repo, sessions=60)
    db = tmp_path / "models.duckdb"
    rng = random.Random(5)
    seen: list[int] = []
    for _ in range(8):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _RUNNER, nats_server.url, str(db),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None
        assert await proc.stdout.readline() == b"started\n"
        await asyncio.sleep(rng.uniform(0.05, 0.4))
        proc.kill()
        await proc.wait()
        checkpoints = _checkpoints(db)
        assert len(set(checkpoints)) == 1  # all models committed together, batch by batch
        seen.append(checkpoints[0])
    # Killed part-way many times (not all before the first batch or after the last).
    assert len({seq for seq in seen if 0 < seq < last}) >= 4, (seen, last)
    assert seen == sorted(seen)  # no kill lost what an earlier run had committed

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _RUNNER, nats_server.url, str(db), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert out.splitlines()[-1] == b"done"
    con = duckdb.connect(str(db))
    try:
        seq, live = snapshot(con)
    finally:
        con.close()
    assert seq == last
    assert compare(live, await rebuilt(store)) == []
