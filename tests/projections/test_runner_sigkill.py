"""The runner in its own process, SIGKILLed while it writes a DuckDB file, many times: the file
it leaves always reflects a whole number of batches, and the run that finishes equals a rebuild
from scratch."""

from __future__ import annotations

import asyncio
import random
import sys
from asyncio.subprocess import Process
from pathlib import Path

import duckdb

from eventstore.repository import Repository
from eventstore.store import PAGE, EventStore
from projections.runner import META
from projections.verify import compare, snapshot
from services.stack.natsserver import NatsServer
from tests.projections.conftest import rebuilt, scripted_history

# Small batches, each commit slowed a little, so a kill lands between and inside commits.  It
# starts up (imports, connects) first and opens the file only when told to: the runners start
# up together, and each runs alone.
_RUNNER = """
import asyncio, sys, time, duckdb
from domain import subjects
from projections import ALL
from projections.runner import Runner
from transport.client import connect
from eventstore.store import EventStore

async def main(url, db, max_batch):
    nc = await connect(url)
    store = EventStore(nc, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    fault = lambda p: time.sleep(0.002)
    runner = Runner(duckdb.connect(db), store, ALL, max_batch=max_batch, fault=fault)
    print("started", flush=True)
    await runner.run(follow=False)
    print("done", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def _runner(url: str, db: Path, max_batch: int = 7) -> Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", _RUNNER, url, str(db), str(max_batch),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def _ready(proc: Process) -> None:
    """Until the runner has started up."""
    assert proc.stdout is not None
    assert await proc.stdout.readline() == b"ready\n"


async def _go(proc: Process) -> None:
    """Let a started-up runner open the file and run; return once it does."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()
    assert await proc.stdout.readline() == b"started\n"


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
    # Eight to kill, then one that runs to the end (in whole pages).
    runners = [await _runner(nats_server.url, db) for _ in range(8)]
    runners.append(await _runner(nats_server.url, db, PAGE))
    try:
        for proc in runners:
            await _ready(proc)
        for proc in runners[:-1]:
            await _go(proc)
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            proc.kill()
            await proc.wait()
            checkpoints = _checkpoints(db)
            assert len(set(checkpoints)) == 1  # all models committed together, batch by batch
            seen.append(checkpoints[0])
        # Killed part-way many times (not all before the first batch or after the last).
        assert len({seq for seq in seen if 0 < seq < last}) >= 4, (seen, last)
        assert seen == sorted(seen)  # no kill lost what an earlier run had committed

        await _go(runners[-1])
        out, _ = await runners[-1].communicate()
        assert out.splitlines()[-1] == b"done"
    finally:
        for left in runners:  # after a failure above: none left to run on its own
            if left.returncode is None:
                left.kill()
                await left.wait()
    con = duckdb.connect(str(db))
    try:
        seq, live = snapshot(con)
    finally:
        con.close()
    assert seq == last
    assert compare(live, await rebuilt(store)) == []
