"""The read models in a process of their own: the manager's child, on its own NATS connection.

Folding every event into DuckDB and committing it took a third of the manager's CPU at 50
sessions/s on 1,000 agents, on the loop that also schedules: with the runner out of its process
a create's p99 fell to about half (docs/benchmarks.md).  Nothing the runner does needs the
manager's memory: the models come from the log, who may read what from the users model
(projections.users), and the agents query's ``last_heartbeat_at`` from the heartbeats the child
hears itself.  So ``python -m services.manager.read_models_process FILE`` runs
services.manager.read_models.ReadModels there, and the manager only supervises it:

- it starts the child and waits for its ready line (its subscriptions are made) before it says
  it is ready itself; a child that fails first (its file held by another process) fails the
  manager's start with the child's own message;
- a child that ends while the manager runs is started again, after a pause that grows while it
  keeps failing; meanwhile the manager answers every query ``unavailable``, saying why (no
  answer at all would read as no manager running);
- the child is killed with the manager however that ends (PR_SET_PDEATHSIG, SIGKILL: the runner
  commits its rows and checkpoint together, so a kill loses nothing it acknowledged), so a
  restarted manager does not find its read models file held by an orphan still stopping.

The child writes its log on stderr, which the manager copies to its own; on stdout it writes
the ready line, then ``seq N`` whenever the sequence its models reflect moved (the manager's
/metrics lag), at most every REPORT_S.  The NATS URL (with the manager's credentials) comes
through the environment, so ``ps`` does not show the password.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import IO

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from domain import subjects
from domain.events import AwareTime
from domain.rpc import is_beat
from eventstore.bulk import bulk_reader
from eventstore.store import event_store
from services.manager.admin_sql import DEFAULT_MEMORY
from services.manager.queries import answer_unavailable
from services.manager.read_models import ReadModels
from transport.client import Client
from transport.connection import (
    connect_for_ever,
    run_process,
    serve_until_signalled,
    unsubscribe_all,
)
from transport.gc_pauses import keep_pauses_short
from transport.pdeathsig import NoParentDeathSignal, die_with_parent
from transport.tasks import Tasks

log = logging.getLogger(__name__)

URL_ENV = "HOIST_READ_MODELS_NATS_URL"
READY = "read models ready"
REPORT_S = 0.5
RESTART_S = (1.0, 30.0)  # the first pause before a restart, and the longest
STOP_S = 30.0  # a child's own stop commits its batch and closes DuckDB: then it is killed
READY_S = 60.0  # from its start to its ready line (it connects and subscribes; no catch-up)
LINE_LIMIT = 1 << 20  # the longest line read from the child (asyncio's default is 64 KiB)


class ReadModelsProcess:
    """``await ReadModelsProcess(nc, url, path).start()`` ... ``await stop()``; ``seq``: what the
    child said its models reflect (None before it said).  ``nc``: the manager's connection,
    which answers the queries while the child is down; ``url``: the child's."""

    def __init__(
        self,
        nc: Client,
        url: str,
        path: str,
        *,
        bulk: bool = True,
        threads: int = 1,
        sql_memory: int = DEFAULT_MEMORY,
    ) -> None:
        self.nc = nc
        self.url = url
        self.path = path
        self.bulk = bulk
        self.threads = threads
        self.sql_memory = sql_memory
        self.seq: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._log_copied: asyncio.Task[None] | None = None  # ends at the child's stderr's end
        self._last_error = ""
        self._down: list[Subscription] = []  # answering the queries meanwhile
        self._down_since = ""  # why and since when, as answered
        self._stopping = False
        self._tasks = Tasks()

    async def start(self) -> None:
        await self._start_child()
        self._tasks.spawn(self._supervise(), name="read models process")

    async def stop(self) -> None:
        self._stopping = True
        await self._end_child()  # first: its last log lines are still copied
        await self._tasks.stop()
        await self._end_child()  # one the supervisor was starting meanwhile
        await unsubscribe_all(self._down)

    async def _start_child(self) -> None:
        """Start the child and return once it is ready; ValueError (what it said) if it ended
        first."""
        args = [sys.executable, "-m", __name__, self.path]
        args += ["--log-level", logging.getLevelName(logging.getLogger().getEffectiveLevel())]
        args += ["--threads", str(self.threads), "--admin-sql-memory", str(self.sql_memory)]
        if not self.bulk:
            args.append("--no-bulk-read")
        try:
            dies_with_us = {"preexec_fn": die_with_parent(signal.SIGKILL)}
        except NoParentDeathSignal as e:
            log.warning("%s: the read models process may outlive the manager", e)
            dies_with_us = {}
        self._last_error = ""
        proc = self._proc = await asyncio.create_subprocess_exec(
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, URL_ENV: self.url},
            # Its own session: a terminal's Ctrl-C reaches the manager, which stops the child
            # in order, not both at once.
            start_new_session=True,
            limit=LINE_LIMIT,
            **dies_with_us,  # type: ignore[arg-type]
        )
        assert proc.stdout is not None and proc.stderr is not None
        self._log_copied = self._tasks.spawn(self._copy_log(proc.stderr), name="read models log")
        try:
            async with asyncio.timeout(READY_S):
                while (line := await proc.stdout.readline()) and line.decode().strip() != READY:
                    pass
        except TimeoutError:
            line = b""
            log.warning("the read models process was not ready in %gs: killed", READY_S)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if not line:  # it ended (or was killed) before it was ready
            await self._ended(proc)
            raise ValueError(
                self._last_error
                or f"the read models process ended (exit code {proc.returncode}) before it was"
                " ready; see its log above"
            )

    async def _ended(self, proc: asyncio.subprocess.Process) -> int:
        """The child's exit code, once its last log line is copied."""
        code = await proc.wait()
        if self._log_copied is not None:
            with contextlib.suppress(TimeoutError):  # a grandchild holding the pipe: not waited
                async with asyncio.timeout(5):
                    await asyncio.shield(self._log_copied)
        return code

    async def _copy_log(self, stderr: asyncio.StreamReader) -> None:
        """The child's log lines onto this process's stderr, the last one kept for errors."""
        while True:
            try:
                line = await stderr.readline()
            except ValueError:  # a line over LINE_LIMIT: what was read of it is dropped
                print(f"{_PROG}: (a log line over {LINE_LIMIT} bytes left out)", file=sys.stderr)
                continue
            if not line:
                return
            text = line.decode(errors="replace").rstrip("\n")
            if text.startswith(f"{_PROG}: "):  # its last word (run_process): said once, by us
                self._last_error = text.removeprefix(f"{_PROG}: ")
            else:
                print(text, file=sys.stderr, flush=True)

    async def _supervise(self) -> None:
        pause = RESTART_S[0]
        while not self._stopping:
            proc = self._proc
            assert proc is not None and proc.stdout is not None
            while line := await proc.stdout.readline():
                word, _, value = line.decode().partition(" ")
                if word == "seq" and value.strip().isdigit():
                    self.seq = int(value)
                    pause = RESTART_S[0]  # it ran: the next failure starts the pauses over
            code = await self._ended(proc)
            why = f": {self._last_error}" if self._last_error else ""
            if not self._stopping:
                self._down_since = f"exit code {code} at {_clock()}"
                self._down = await answer_unavailable(self.nc, self._why_down)
            while not self._stopping:
                log.warning(
                    "the read models process ended (exit code %s%s): starting it again in %gs;"
                    " queries are answered 'unavailable' meanwhile",
                    code,
                    why,
                    pause,
                )
                why = ""
                await asyncio.sleep(pause)
                pause = min(pause * 2, RESTART_S[1])
                try:
                    await self._start_child()
                except Exception as e:  # whatever it was, the supervisor tries again
                    log.warning("the read models process did not start: %s", e)
                    failed = self._proc.returncode if self._proc else None
                    self._down_since = (
                        f"exit code {failed} at {_clock()}, a restart failing; next in {pause:g}s"
                    )
                    continue
                await unsubscribe_all(self._down)  # it answers now
                self._down = []
                log.info("the read models process runs again: queries are answered")
                break

    def _why_down(self) -> str:
        return (
            f"the manager's read models process ended ({self._down_since}) and is being started"
            " again; see the manager's log"
        )

    async def _end_child(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            async with asyncio.timeout(STOP_S):
                await self._ended(proc)
        except TimeoutError:
            log.warning("the read models process did not stop in %gs: killed", STOP_S)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def _clock() -> str:
    return datetime.now().astimezone().strftime("%H:%M:%S")


# -- the child --------------------------------------------------------------------------------

_PROG = "hoist read models"


class _Beat(msgspec.Struct):
    """What the read models take of a heartbeat (msgspec skips the other fields)."""

    agent_id: str
    sent_at: AwareTime


class HeartbeatTimes:
    """When each agent last sent a heartbeat (by its clock), as heard on hoist.heartbeat.*:
    the agents query's ``last_heartbeat_at``, which is no event."""

    def __init__(self) -> None:
        self.sent_at: dict[str, datetime] = {}
        self._decode = msgspec.json.Decoder(_Beat).decode

    async def follow(self, nc: Client) -> Subscription:
        return await nc.subscribe(f"{subjects.HEARTBEAT}.*", cb=self._on_beat)

    def last(self, agent_id: str) -> datetime | None:
        return self.sent_at.get(agent_id)

    async def _on_beat(self, msg: Msg) -> None:
        # As the liveness watcher: only a beat (not a reflected stored message), well formed,
        # naming the agent its subject names (which nats.conf ties to the agent's user).
        if not is_beat(msg.headers):
            return
        try:
            beat = self._decode(msg.data)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return  # the liveness watcher logs it
        agent_id = msg.subject.rsplit(".", 1)[-1]
        if beat.agent_id == agent_id:
            self.sent_at[agent_id] = beat.sent_at


class _Child:
    """The service the child runs: heartbeat times, the read models, and its reports."""

    def __init__(
        self,
        nc: Client,
        path: str,
        bulk_url: str | None,
        out: IO[str],
        threads: int = 1,
        sql_memory: int = DEFAULT_MEMORY,
    ) -> None:
        self.nc = nc
        self.beats = HeartbeatTimes()
        bulk = bulk_reader(bulk_url) if bulk_url else None
        store = event_store(nc)
        # Alone in this process: its reads wait out its commits' pause (projections.runner).
        self.read_models = ReadModels(
            nc,
            store,
            path,
            bulk,
            last_heartbeat=self.beats.last,
            share_tail=False,
            threads=threads,
            sql_memory=sql_memory,
        )
        self.out = out
        self._subs: list[Subscription] = []
        self._tasks = Tasks()

    async def start(self) -> None:
        self._subs = [await self.beats.follow(self.nc)]
        await self.read_models.start()
        self._tasks.spawn(self._report(), name="report the read models' sequence")

    async def stop(self) -> None:
        await unsubscribe_all(self._subs)
        await self._tasks.stop()
        await self.read_models.stop()

    async def _report(self) -> None:
        said = None
        while True:
            await asyncio.sleep(REPORT_S)
            runner = self.read_models.runner
            if runner is not None and runner.seq != said:
                said = runner.seq
                print(f"seq {said}", file=self.out, flush=True)


async def _run(path: str, bulk: bool, threads: int, sql_memory: int) -> None:
    url = os.environ.pop(URL_ENV, "")
    if not url:
        raise ValueError(f"{URL_ENV} is not set: the manager passes the NATS URL there")
    # What the runner keeps of every session lives as long as the process, as the manager's
    # view does: each full collection visited all of it (150 ms at 22,500 live sessions, on
    # the cores the creates use) until frozen (transport.gc_pauses).
    keep_pauses_short()
    nc = await connect_for_ever(url, "hoist-read-models", log)
    child = _Child(nc, path, url if bulk else None, sys.stdout, threads, sql_memory)
    await serve_until_signalled(nc, child, READY)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=_PROG, description="The manager's read models (started by the manager)."
    )
    p.add_argument("path", help="the DuckDB file, or :memory:")
    p.add_argument("--no-bulk-read", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="DuckDB's threads")
    p.add_argument("--admin-sql-memory", type=int, default=DEFAULT_MEMORY, help="bytes")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    hint = "check the manager's --nats-url and that nats-server runs"
    serve = _run(args.path, not args.no_bulk_read, args.threads, args.admin_sql_memory)
    return run_process(_PROG, args.log_level, serve, hint)


if __name__ == "__main__":
    sys.exit(main())
