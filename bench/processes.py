"""The benchmarks' processes: a nats-server (or a cluster) in a temp dir with the dummy agents
(bench/lifecycle.py's agents role) on it, managers, and how each is started and stopped.
Shared by bench/lifecycle.py and bench/chaos_managers.py."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from services.stack.natsserver import NatsCluster, NatsServer

LIFECYCLE = str(Path(__file__).resolve().parent / "lifecycle.py")
ROOT = Path(__file__).resolve().parents[1]  # `python -m services...` finds the project here


async def spawn(*args: str, ready: str, log: Path) -> asyncio.subprocess.Process:
    """``python ARGS``, once it printed the line ``ready`` (its stderr appended to ``log``)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=log.open("ab"), cwd=ROOT
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        if line.decode().strip() != ready:
            raise RuntimeError(f"{args[:2]} did not start: {line!r}; see {log}")
    except BaseException:
        if proc.returncode is None:  # not ready: no process is left behind the bench
            proc.kill()
            await proc.wait()
        raise
    return proc


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def manager(
    url: str,
    name: str,
    log: Path,
    *extra: str,
    ttl: float | None = None,
    profile: str | None = None,
) -> asyncio.subprocess.Process:
    """A manager called ``name`` in the lease (``--lease-ttl TTL`` if given; under cProfile,
    stats to ``profile``, if given), once it is ready."""
    args = ["-m", "services.manager", "--nats-url", url, "--manager-id", name]
    args += ["--log-level", "WARNING", *(["--lease-ttl", str(ttl)] if ttl else []), *extra]
    cprofile = ["-m", "cProfile", "-o", profile] if profile else []
    return await spawn(*cprofile, *args, ready="manager ready", log=log)


def nats(tmpdir: Path, nodes: int, sync_always: bool) -> NatsServer | NatsCluster:
    """One nats-server or an ``nodes``-node cluster (R3 streams) in ``tmpdir``, fsyncing before
    every ack with ``sync_always`` (the project's nats.conf) or every 2 min (the default)."""
    if nodes > 1:
        return NatsCluster(tmpdir / "cluster", nodes, sync_always=sync_always)
    config = None
    if sync_always:
        config = tmpdir / "nats.conf"
        store = json.dumps(str(tmpdir / "nats"))
        config.write_text(f"jetstream {{\n store_dir: {store}\n sync_interval: always\n}}\n")
    return NatsServer(tmpdir / "nats", config=config)


@dataclass
class Fleet:
    """The server(s) and agents of one run: their URL, the processes' log (stderr of every
    process started with it) and, once the run is over, that log's text."""

    url: str
    log: Path
    text: str = ""

    def lines(self, having: str) -> list[str]:
        return [line for line in self.text.splitlines() if having in line]


@asynccontextmanager
async def fleet(nodes: int, sync_always: bool, agents: int) -> AsyncIterator[Fleet]:
    """A fresh nats-server (``nodes`` > 1: a cluster) in a temp dir and ``agents`` dummy agents
    (1000 cpu each, the image preloaded, zero delays) in one process on it; all stopped after."""
    with tempfile.TemporaryDirectory(prefix="hoist-bench-") as tmp:
        tmpdir = Path(tmp)
        log = tmpdir / "processes.log"
        with nats(tmpdir, nodes, sync_always) as server:
            out = Fleet(server.url, log)
            procs = await spawn(
                LIFECYCLE, "--role", "agents", "--url", server.url, "--agents", str(agents),
                ready="agents ready", log=log,
            )  # fmt: skip
            try:
                yield out
            finally:
                await stop(procs)
                out.text = log.read_text(errors="replace")
