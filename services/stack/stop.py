"""`hoist down`: stop the stack of a data dir from any terminal.

The stack's processes are the ones holding its lock file open (``services/stack/lock.py``:
`hoist up` and every child it started inherit it), so that is how they are found: a pid in a
stale ``stack.json`` that the system has since given to another process is never signalled.
`hoist up` itself is asked first (SIGTERM: it stops agents, manager, then nats-server in order,
as on Ctrl-C); processes left without it (it was killed) get SIGTERM in the same order; any
still there after the wait get SIGKILL (the manager and agents recover from a kill by design).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.stack.lock import DataDirLock
from services.stack.up import StackInfo, _running, is_nats

STOP_WAIT_S = 30.0  # `hoist up` gives each group of children 10 s before it kills them
KILL_WAIT_S = 5.0


class StopError(Exception):
    """The stack could not be stopped; the message says what to do."""


@dataclass
class Stopped:
    """What `hoist down` did: the processes it stopped (name -> pid) and how."""

    processes: dict[str, int] = field(default_factory=dict)
    killed: list[str] = field(default_factory=list)  # did not end on SIGTERM in time

    @property
    def nothing(self) -> bool:
        return not self.processes


def lock_holders(data_dir: Path) -> set[int]:
    """The pids of the processes that hold ``data_dir``'s lock file open (the ones visible to
    this user: /proc/PID/fd of others' processes cannot be read)."""
    target = os.path.realpath(DataDirLock(data_dir).path)
    holders: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone meanwhile, or another user's
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    holders.add(int(entry.name))
                    break
            except OSError:
                continue
    holders.discard(os.getpid())
    return holders


def stop_stack(
    data_dir: Path,
    *,
    wait_s: float = STOP_WAIT_S,
    holders: Callable[[Path], set[int]] = lock_holders,
) -> Stopped:
    """Stop every process of ``data_dir``'s stack and wait until the data dir's lock is free;
    an empty Stopped when nothing runs there. Idempotent."""
    lock = DataDirLock(data_dir)
    if not lock.held():
        return Stopped()
    try:
        info = StackInfo.read(data_dir)
    except (OSError, ValueError, KeyError):
        info = None  # a half-written or foreign file: the lock's holders still say who runs
    pids = holders(data_dir)
    if not pids:
        raise StopError(
            f"a process this user cannot see holds {lock.path}: find it with"
            f" `fuser -v {lock.path}` and stop it (as its owner)"
        )
    names = _names(info, pids)
    stopped = Stopped(processes={names[p]: p for p in pids})
    deadline = time.monotonic() + wait_s
    if info is not None and info.pid in pids:
        _signal([info.pid], signal.SIGTERM)  # it stops its children in order, as on Ctrl-C
    else:
        for group in _groups(names):
            _signal(group, signal.SIGTERM)
            _wait_gone(group, min(deadline, time.monotonic() + wait_s / 3))
    if not _wait_free(lock, deadline):
        left = sorted(holders(data_dir))
        _signal(left, signal.SIGKILL)
        stopped.killed = [names.get(p, str(p)) for p in left]
        if not _wait_free(lock, time.monotonic() + KILL_WAIT_S):
            still = " ".join(map(str, sorted(holders(data_dir)))) or "?"
            raise StopError(
                f"the stack in {data_dir} did not stop: pids {still} still hold {lock.path};"
                f" see `fuser -v {lock.path}`"
            )
    return stopped


def _names(info: StackInfo | None, pids: set[int]) -> dict[int, str]:
    known = {pid: name for name, pid in (info.pids.items() if info else ())}
    if info is not None:
        known[info.pid] = "hoist up"
    return {pid: known.get(pid, f"pid {pid}") for pid in pids}


def _groups(names: dict[int, str]) -> list[list[int]]:
    """Agents (and anything unnamed) first, then the manager, then nats-server: each finishes
    what it publishes while the server still runs."""
    managers = [p for p, n in names.items() if n == "manager" or n.startswith("manager-")]
    servers = [p for p, n in names.items() if is_nats(n)]
    first = [p for p in names if p not in managers and p not in servers]
    return [first, managers, servers]


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as e:
            msg = f"may not signal pid {pid} ({e.strerror}): stop it as its owner"
            raise StopError(msg) from None


def _wait_gone(pids: list[int], deadline: float) -> None:
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _wait_free(lock: DataDirLock, deadline: float) -> bool:
    while lock.held():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
