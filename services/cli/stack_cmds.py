"""`hoist down` and `hoist status`: stop the local stack of a data dir, and check it (a doctor:
its processes, NATS, the manager and its read models, the agents, their Docker Engine, disk).

Both act on the data dir's stack itself (its stack.json, lock and credentials), not on
HOIST_NATS_URL: they are about the processes `hoist up` started on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nats.errors import NoRespondersError
from nats.js.errors import ServiceUnavailableError

from agent.runtime.dummy_shell import SIMULATES
from client.connection import CliError, Connection, ReplyError
from domain import subjects
from domain.admission import lease_holder
from eventstore.store import EventStore, StoreError, event_store
from services.stack import up as stack
from services.stack.home import start_command
from services.stack.lock import DataDirLock
from services.stack.stop import StopError, lock_holders, stop_stack
from transport import credentials

LOW_DISK_BYTES = 1024**3  # below this free in the data dir's filesystem: a problem
CATCH_UP_S = 3.0  # how long the read models may take to reach the log's head


def hoist_command() -> str:
    """How another terminal runs this `hoist`: plain ``hoist`` when PATH has one, else this
    virtualenv's script by its full path (so the banner's commands work as printed)."""
    if shutil.which("hoist"):
        return "hoist"
    script = Path(sys.executable).parent / "hoist"
    return str(script.absolute()) if script.exists() else f"{sys.executable} -m services.cli.main"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    down = sub.add_parser("down", help="stop the local stack (nats-server, manager, agents)")
    down.set_defaults(func=cmd_down)
    status = sub.add_parser("status", help="check the local stack: processes, NATS, manager, …")
    status.add_argument("-o", "--output", choices=("text", "json"), default="text")
    status.add_argument("--json", action="store_const", const="json", dest="output")
    status.set_defaults(func=cmd_status)


# --- down ----------------------------------------------------------------------------------------


async def cmd_down(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    try:
        stopped = await asyncio.to_thread(stop_stack, data_dir)
    except StopError as e:
        raise CliError(str(e)) from None
    if stopped.nothing:
        print(f"no Hoist stack runs in {data_dir}: nothing to stop")
        return 0
    names = ", ".join(sorted(stopped.processes))
    print(f"stopped the Hoist stack in {data_dir} ({names})")
    if stopped.killed:
        print(f"  killed after the wait: {', '.join(stopped.killed)}")
    print(f"  its data stays there; start it again with `{start_command(data_dir)}`")
    return 0


# --- status --------------------------------------------------------------------------------------


@dataclass
class Check:
    check: str
    ok: bool
    detail: str
    next: str = ""  # what to do about a problem


async def cmd_status(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir)
    checks = await diagnose(data_dir)
    if args.output == "json":
        doc = {
            "data_dir": str(data_dir),
            "ok": all(c.ok for c in checks),
            "checks": [asdict(c) for c in checks],
        }
        print(json.dumps(doc, indent=2))
    else:
        width = max(len(c.check) for c in checks)
        for c in checks:
            line = f"{'ok' if c.ok else 'PROBLEM':8} {c.check:{width}}  {c.detail}"
            print(f"{line}: {c.next}" if c.next else line)
    return 0 if all(c.ok for c in checks) else 1


async def diagnose(data_dir: Path) -> list[Check]:
    restart = f"hoist down --data-dir {data_dir}; {start_command(data_dir)}"
    try:
        info = stack.StackInfo.read(data_dir)
    except (OSError, ValueError, KeyError) as e:
        info = None
        checks = [Check("stack", False, f"{data_dir / stack.STATE_FILE} unreadable ({e})")]
    else:
        checks = []
    if info is None or not info.alive():
        if DataDirLock(data_dir).held():
            pids = " ".join(map(str, sorted(await asyncio.to_thread(lock_holders, data_dir))))
            checks.append(
                Check(
                    "stack",
                    False,
                    f"not running in {data_dir}, but processes still hold it (pids {pids})",
                    f"stop them with `hoist down --data-dir {data_dir}`",
                )
            )
        else:
            checks.append(
                Check(
                    "stack",
                    False,
                    f"not running in {data_dir}",
                    f"start it with `{start_command(data_dir)}`",
                )
            )
        return [*checks, _disk(data_dir)]
    checks.append(
        Check("stack", True, f"running in {data_dir} (hoist up pid {info.pid}, {info.url})")
    )
    for name, pid in info.pids.items():
        if stack._running(pid):
            checks.append(Check(name, True, f"pid {pid} alive"))
        else:
            log = (
                stack.nats_log(data_dir, name)
                if stack.is_nats(name)
                else data_dir / f"logs/{name}.log"
            )
            checks.append(Check(name, False, f"pid {pid} gone", f"see {log}; then `{restart}`"))
    checks += _addresses(data_dir, info)
    over_nats, runtimes = await _over_nats(data_dir, info, restart)
    checks += over_nats
    if "dummy" in {info.runtime, *runtimes}:  # what it only pretends, said plainly
        checks.append(Check("runtime", True, f"dummy, which simulates {SIMULATES}"))
    if "docker" in {info.runtime, *runtimes}:
        checks.append(await asyncio.to_thread(_docker, info.docker_host or None))
    checks.append(_disk(data_dir))
    return checks


def _addresses(data_dir: Path, info: stack.StackInfo) -> list[Check]:
    """Where the web view and each process's Prometheus /metrics answer: the web view's with
    the token that logs the local admin in (as `hoist web --url` prints it)."""
    web = info.web_login(data_dir) or "not started (hoist up --no-web); `hoist web` serves one"
    metrics = ", ".join(f"{name} {url}" for name, url in info.metrics.items())
    return [Check("web-view", True, web), Check("metrics", True, metrics or "none")]


async def _over_nats(
    data_dir: Path, info: stack.StackInfo, restart: str
) -> tuple[list[Check], set[str]]:
    """NATS, the manager, its read models' lag and the agents (through the client role); and
    the runtimes of the agents registered."""
    try:
        url = credentials.role_url(info.url, "client", credentials.load_credentials(data_dir))
    except (OSError, ValueError, KeyError) as e:
        return [Check("nats", False, f"no client credentials in {data_dir} ({e})", restart)], set()
    try:
        conn = await Connection.open(url, "hoist-status")
    except CliError as e:
        log = data_dir / "nats-server.log"
        return [Check("nats", False, str(e), f"see {log}; `{restart}`")], set()
    checks = [Check("nats", True, f"{info.url} reachable")]
    runtimes: set[str] = set()
    manager_log = data_dir / "logs" / "manager.log"
    try:
        head = await event_store(conn.nc).head()
        # The lease is read from the log itself: said even while the read models are down.
        checks.append(await _leader(event_store(conn.nc), manager_log))
        try:
            reply = await conn.request(
                f"{subjects.QUERY}.agents", {}, wait_s=CATCH_UP_S, read_again=False
            )
        except CliError as e:
            advice = f"see {manager_log}; `{restart}`"
            if isinstance(e, ReplyError) and e.code == "unavailable":  # read models restarting
                advice = f"the manager starts them again itself: ask again soon (see {manager_log})"
            checks.append(Check("queries", False, str(e), advice))
            return checks, runtimes
        checks.append(Check("queries", True, "the manager answers"))
        checks.append(await _lag(conn, head, reply, manager_log))
        rows = reply.get("rows", [])
        checks.append(_agents(data_dir, info, rows))
        runtimes = {r["runtime"] for r in rows if r.get("alive") and r.get("runtime")}
    except StoreError as e:
        checks.append(Check("event log", False, str(e), f"see {data_dir / 'nats-server.log'}"))
    finally:
        await conn.close()
    return checks, runtimes


async def _leader(store: EventStore, log: Path) -> Check:
    """Which manager leads: the holder of the managers' lease (services.manager.leadership)."""
    last = await store.last(subjects.manager_lease())
    if last is not None and (holder := lease_holder(last.subject, last.headers, last.data)):
        return Check("leader", True, f"{holder} leads (lease at event {last.seq})")
    info = None  # the client role's account has direct gets of the log only
    if store.nc.in_log_account:
        with contextlib.suppress(NoRespondersError, ServiceUnavailableError):
            info = await store.js.stream_info(store.stream)
    if info is not None and not info.config.allow_msg_ttl:
        return Check("leader", True, "one manager, unleased (a stream made before leases)")
    return Check(
        "leader",
        False,
        "no manager holds the lease",
        f"a standby takes over within the lease TTL; if none does, see {log}",
    )


async def _lag(conn: Connection, head: int, reply: dict[str, Any], log: Path) -> Check:
    seq = int(reply.get("seq", 0))
    if seq >= head:
        return Check("read models", True, f"up to date (event {head})")
    try:  # a moment behind is normal while events arrive: let them catch up first
        await conn.request(
            f"{subjects.QUERY}.agents",
            {"min_seq": head, "timeout": CATCH_UP_S},
            wait_s=CATCH_UP_S + 2,
            read_again=False,
        )
    except CliError:
        return Check(
            "read models",
            False,
            f"{head - seq} event(s) behind the log (at {seq} of {head}) after {CATCH_UP_S:g}s",
            f"the manager is busy or stuck: see {log}",
        )
    return Check("read models", True, f"caught up (event {head}; was {head - seq} behind)")


def _agents(data_dir: Path, info: stack.StackInfo, rows: list[dict[str, Any]]) -> Check:
    alive = sorted(r["agent_id"] for r in rows if r.get("alive"))
    missing = [a for a in info.agents if a not in alive]
    detail = f"{len(alive)} alive" + (f" ({', '.join(alive)})" if alive else "")
    if missing:
        logs = ", ".join(str(data_dir / "logs" / f"{a}.log") for a in missing)
        return Check("agents", False, f"{detail}; not alive: {', '.join(missing)}", f"see {logs}")
    if not alive and info.agents:
        return Check("agents", False, "none alive", "see the agents' logs")
    return Check("agents", True, detail)


def _docker(docker_host: str | None) -> Check:
    version, where = stack.docker_version(docker_host)
    if version is None:
        return Check(
            "docker",
            False,
            f"no Docker Engine reachable at {where}",
            "start dockerd (the docker agents cannot start kernels without it)",
        )
    return Check("docker", True, f"Docker Engine {version} at {where}")


def _disk(data_dir: Path) -> Check:
    probe = data_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # a data dir not made yet: the filesystem it would be on
    usage = shutil.disk_usage(probe)
    free = f"{usage.free / 1024**3:.1f} GiB free in {probe}"
    if usage.free < LOW_DISK_BYTES:
        return Check("disk", False, free, "free some space: the event log and images need it")
    return Check("disk", True, free)
