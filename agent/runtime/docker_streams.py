"""Output streams (a log, an exec's output) from their threads to the event loop, bounded by a
``_Handoff``; an exec, and the pid inside its container of a process of ours."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import docker
import docker.errors
import requests

from agent.runtime.docker_client import _Conn

# At most this many bytes of one log or exec stream wait for the reader (plus one chunk).
HANDOFF_BYTES = 1 << 20
# A stream's bytes that come fast are handed over at most every _BATCH_S unless this many wait.
_BATCH_BYTES = 64 * 1024
_BATCH_S = 0.005


class _Handoff:
    """Bytes from a stream's thread to the loop, bounded: ``put`` waits while ``limit`` bytes or
    more wait for the reader, so the runtime never holds more than ``limit`` plus one chunk of a
    stream; ``get`` takes all that waits as one chunk (one loop callback per batch, not per
    chunk), and while bytes come fast, a few small ones at most every ``_BATCH_S`` (an
    occasional line still comes at once).  ``close`` (the reader went away) makes ``put``
    refuse at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int | None = None) -> None:
        self.loop = loop
        self.limit = limit or HANDOFF_BYTES
        self._cond = threading.Condition()
        self._buf = bytearray()
        self._ended = False
        self._error: BaseException | None = None
        self._closed = False
        self._notified = False  # a wake-up is on its way to the loop
        self._ready = asyncio.Event()
        self._taken_at = 0.0  # monotonic time of the last get that took bytes
        self.peak = 0  # the most bytes that waited at once (for tests)
        self.wakeups = 0  # loop callbacks made (for tests)

    # In the stream's thread.
    def put(self, chunk: bytes, aborted: Callable[[], bool] = lambda: False) -> bool:
        """False once the reader went away (or ``aborted()``): stop reading."""
        with self._cond:
            while len(self._buf) >= self.limit:
                if self._closed or aborted() or self.loop.is_closed():
                    return False
                self._cond.wait(0.1)  # a timeout: an abort must wake it, however it comes
            if self._closed:
                return False
            self._buf += chunk
            self.peak = max(self.peak, len(self._buf))
            self._wake()
        return True

    def finish(self, error: BaseException | None = None) -> None:
        with self._cond:
            self._ended, self._error = True, error
            self._wake()

    def _wake(self) -> None:
        if not self._notified:
            self._notified = True
            self.wakeups += 1
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads
                self.loop.call_soon_threadsafe(self._ready.set)

    # On the loop.
    async def get(self) -> bytes | None:
        """What waits, as one chunk; None at the end (after raising the stream's error)."""
        while True:
            with self._cond:
                delay = 0.0
                if 0 < len(self._buf) < _BATCH_BYTES and not self._ended:
                    delay = self._taken_at + _BATCH_S - time.monotonic()
                if delay > 0:
                    self._notified = True  # no wake-ups needed: the loop looks after the delay
                else:
                    self._notified = False
                    self._ready.clear()
                    if self._buf:
                        data = bytes(self._buf)
                        self._buf.clear()
                        self._taken_at = time.monotonic()
                        self._cond.notify_all()
                        return data
                    if self._ended:
                        error, self._error = self._error, None
                        if error is not None:
                            raise error
                        return None
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await self._ready.wait()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _pump(handoff: _Handoff, conn: _Conn, chunks: Any) -> None:
    """In a stream's thread: hand every chunk to the loop, then an error (unless aborted), then
    the end."""
    error: BaseException | None = None
    try:
        for chunk in chunks():
            if conn.aborted:
                break
            if chunk and not handoff.put(chunk, lambda: conn.aborted):
                break
    except BaseException as e:
        if not conn.aborted:
            error = e
    finally:
        conn.close()
        handoff.finish(error)


async def _drain(handoff: _Handoff) -> AsyncIterator[bytes]:
    while (chunk := await handoff.get()) is not None:
        yield chunk


def _container_pid(host_pid: int, container_id: str) -> int | None:
    """The pid inside its container of our ``/proc``'s process ``host_pid``, if /proc says it
    is a process of that container (its cgroup names the container); else None (gone, or our
    /proc is of another pid namespace than the daemon's)."""
    try:
        with open(f"/proc/{host_pid}/cgroup") as f:
            if container_id not in f.read():
                return None
        with open(f"/proc/{host_pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])  # the innermost namespace's: the container's
    except (OSError, ValueError):
        return None
    return None


class _ExecRuntime(Protocol):
    """What an exec uses of its runtime (a DockerRuntime)."""

    base_url: str
    api: docker.APIClient
    local: bool


class _DockerExec:
    """One exec: its output streams in a thread of its own; ``kill`` ends its process."""

    def __init__(
        self, runtime: _ExecRuntime, exec_id: str, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.runtime = runtime
        self.exec_id = exec_id
        self.conn = _Conn(runtime.base_url)
        self.handoff = _Handoff(loop)
        self.ended = asyncio.Event()
        self._drained = False

        def chunks() -> Any:
            return self.conn.api.exec_start(exec_id, stream=True)

        def run() -> None:
            try:
                _pump(self.handoff, self.conn, chunks)
            finally:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self.ended.set)

        self.thread = threading.Thread(target=run, name=f"exec {exec_id[:12]}", daemon=True)
        self.thread.start()

    async def output(self) -> AsyncIterator[bytes]:
        """Read it: once ``HANDOFF_BYTES`` wait unread, the command waits to write, as on a pipe."""
        if self._drained:
            return
        self._drained = True
        async for chunk in _drain(self.handoff):
            yield chunk

    async def _inspect(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.runtime.api.exec_inspect, self.exec_id)

    async def wait(self) -> int:
        await self.ended.wait()
        # The output ends when the process closes it; the engine records the exit just after.
        for _ in range(200):
            info = await self._inspect()
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            await asyncio.sleep(0.05)
        raise TimeoutError(f"exec {self.exec_id} ended its output but is still running")

    async def kill(self) -> None:
        try:
            for _ in range(200):
                info = await self._inspect()
                pid = int(info.get("Pid") or 0)
                if info.get("Running") and pid > 0:
                    await self._kill(str(info.get("ContainerID") or ""), pid)
                    break
                if info.get("ExitCode") is not None:
                    break  # ended already
                await asyncio.sleep(0.05)  # not started yet
        finally:
            # Whatever happened above: a child that inherited its output must not keep the
            # stream (and its thread) going.
            self.handoff.close()
            self.conn.abort()

    async def _kill(self, container_id: str, pid: int) -> None:
        """The engine has no API to signal an exec; ``pid`` is its process as the daemon sees
        it (in the daemon's pid namespace)."""
        if not self.runtime.local:
            # A remote daemon: its pids are not ours, and nothing tells the command's pid inside
            # the container.  The command runs on until it ends; its stream is closed (by the
            # caller), so nobody waits for it.
            return
        in_container = await asyncio.to_thread(_container_pid, pid, container_id)
        if in_container is None:
            # Our /proc is not the daemon's (the agent runs in another pid namespace) or the
            # process is gone: as with a remote daemon, it runs on until it ends.
            return
        try:
            os.kill(pid, signal.SIGKILL)
            return
        except ProcessLookupError:
            return  # ended meanwhile
        except OSError:
            pass  # not ours to signal (an agent that is not root): kill it from inside
        api = self.runtime.api
        with contextlib.suppress(docker.errors.APIError, requests.RequestException):
            killer = await asyncio.to_thread(
                api.exec_create, container_id, ["kill", "-9", str(in_container)], user="0"
            )
            await asyncio.to_thread(api.exec_start, killer["Id"])
