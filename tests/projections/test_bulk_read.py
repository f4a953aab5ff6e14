"""Catch-up through the bulk reader's child process: the same records, the same read models,
a clear error when the child cannot read, and no child left behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import duckdb
import pytest

from domain import subjects
from eventstore.bulk import BulkReader
from eventstore.repository import Repository
from eventstore.store import EventStore, Message, Recorded, StoreError, Write
from projections import ALL
from projections.runner import Runner
from projections.verify import compare, snapshot
from services.stack.natsserver import NatsServer
from tests.projections.conftest import rebuilt, scripted_history


def _bulk_children(parent: int | None = None) -> dict[int, str]:
    """Running bulk reader processes of ``parent`` (this process by default; the tests of other
    workers run theirs at the same time): pid -> command line."""
    parent = os.getpid() if parent is None else parent
    out = {}
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            # After the command's parentheses (it may hold any character): state, ppid.
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            args = (proc / "cmdline").read_bytes().split(b"\0")  # empty for a zombie
            if ppid == parent and b"eventstore.bulk" in args:
                out[int(proc.name)] = b" ".join(args).decode(errors="replace")
    return out


def _running(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` still running as bulk readers (a zombie, ended, holds no command line;
    a pid used again since by another process holds another one)."""
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"eventstore.bulk" in args:
                out.append(pid)
    return out


class CountingBulk(BulkReader):
    """A bulk reader that counts the stretches it was asked for."""

    def __init__(self, url: str) -> None:
        super().__init__(url, subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
        self.stretches: list[tuple[int, int]] = []

    async def pages(self, from_seq: int, until_seq: int) -> AsyncIterator[list[Recorded]]:
        self.stretches.append((from_seq, until_seq))
        async for page in super().pages(from_seq, until_seq):
            yield page


async def test_bulk_pages_hold_what_replay_reads(
    nats_server: NatsServer, store: EventStore, repo: Repository
) -> None:
    last = await scripted_history(repo, sessions=150)
    assert last > 1000  # more than one page
    bulk = CountingBulk(nats_server.url)
    for from_seq, until_seq in ((1, last), (7, last - 300), (last, last)):
        want = [r async for r in store.replay(from_seq=from_seq, until_seq=until_seq)]
        got = [r async for page in bulk.pages(from_seq, until_seq) for r in page]
        assert got == want
        assert got[0].seq == from_seq and got[-1].seq == until_seq
    assert [r async for page in bulk.pages(5, 4) for r in page] == []


async def test_a_runner_catching_up_through_the_bulk_reader_builds_the_same_models(
    nats_server: NatsServer, store: EventStore, repo: Repository
) -> None:
    await scripted_history(repo, sessions=30)
    in_process = duckdb.connect()
    last = await Runner(in_process, store, ALL).run(follow=False)

    bulk = CountingBulk(nats_server.url)
    through_child = duckdb.connect()
    runner = Runner(through_child, store, ALL, bulk=bulk, bulk_min=100, max_batch=333)
    assert await runner.run(follow=False) == last
    assert bulk.stretches == [(1, last)]  # the whole way behind: all of it through the child
    seq, tables = snapshot(through_child)
    assert seq == last
    assert compare(tables, in_process) == []

    # A little behind (less than bulk_min), the runner reads in-process.
    await scripted_history(repo, sessions=1, seed=99, prefix="late")
    assert await runner.run(follow=False) > last
    assert bulk.stretches == [(1, last)]


async def test_a_bulk_reader_that_cannot_read_says_why_and_the_runner_reads_in_process(
    store: EventStore, repo: Repository
) -> None:
    bulk = BulkReader("nats://127.0.0.1:1", subjects.EVENT_STREAM, [subjects.EVENTS_ALL])
    with pytest.raises(
        StoreError,
        match=r"bulk reader of stream HOIST stopped \(exit code 1\): .*cannot connect to NATS",
    ):
        async for _ in bulk.pages(1, 10):
            pass
    assert _bulk_children() == {}

    last = await scripted_history(repo, sessions=5)
    con = duckdb.connect()
    assert await Runner(con, store, ALL, bulk=bulk, bulk_min=1).run(follow=False) == last
    assert compare(snapshot(con)[1], await rebuilt(store)) == []


async def test_stopping_early_ends_the_child_and_its_password_is_not_in_ps(
    nats_server: NatsServer, store: EventStore, repo: Repository
) -> None:
    last = await scripted_history(repo, sessions=40)
    url = nats_server.url.replace("nats://", "nats://reader:s3cret@")  # an open server lets it in
    pages = BulkReader(url, subjects.EVENT_STREAM, [subjects.EVENTS_ALL]).pages(1, last)
    async with contextlib.aclosing(pages):
        async for page in pages:
            assert page[0].seq == 1
            [running] = _bulk_children().values()
            assert "s3cret" not in running
            break
    assert _bulk_children() == {}


async def test_a_killed_parent_leaves_no_bulk_reader_behind(
    nats_server: NatsServer, store: EventStore
) -> None:
    filler = Message(b"x" * 1000, {"Hoist-Event": "Filler"})
    for i in range(20):  # 20 MB: more than the child's read-ahead and the pipe hold
        await store.append([Write(subjects.session_events(f"s{i}"), [filler] * 1000)])
    script = (
        "import asyncio\n"
        "from eventstore.bulk import BulkReader\n"
        "async def main():\n"
        f"    bulk = BulkReader({nats_server.url!r}, 'HOIST', ['hoist.events.>'])\n"
        "    async for page in bulk.pages(1, 20000):\n"
        "        print('page', flush=True)\n"
        "        await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n"
    )
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
    )
    children: dict[int, str] = {}
    try:
        assert parent.stdout is not None
        assert await parent.stdout.readline() == b"page\n"
        children = _bulk_children(parent.pid)
        assert len(children) == 1
    finally:
        parent.kill()  # SIGKILL: no finally of the parent runs
        await parent.wait()
    for _ in range(100):
        if not _running(children):
            break
        await asyncio.sleep(0.1)
    assert _running(children) == []
