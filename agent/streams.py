"""Output streams the agent serves (``logs`` and ``exec``), read with ``stream-read``.

One ``Stream`` per open stream: a producer task appends what the runtime yields to a bounded
buffer and never waits for a reader (a slow reader never blocks the agent: what it fell too far
behind to get is counted as ``dropped``).  A reader asks for the bytes from its cursor.  A stream
nobody read for ``idle_s`` (and no read waits on) is closed: its producer is cancelled (an exec's
command is killed).

Limits, so that one client cannot take the streams of everyone else: a session (the kernel's)
keeps at most ``MAX_SESSION_STREAMS`` unfinished streams (the next is refused, naming the
session); the agent keeps at most ``MAX_STREAMS`` and, when full, makes room by evicting the
stream least recently used (opened or read), never one a read waits on.  A reader of a stream
that expired or was evicted gets not-found ``EVICTED``: it opens the stream again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from agent.runtime.base import ExecRun
from domain import rpc
from transport.tasks import Tasks, every

log = logging.getLogger(__name__)

BUFFER_BYTES = 1024 * 1024  # kept per stream
IDLE_S = 30.0
# Open per agent: at most MAX_STREAMS * BUFFER_BYTES = 128 MiB of buffered output.  When full,
# the least recently used stream is evicted rather than a new one refused.
MAX_STREAMS = 128
MAX_SESSION_STREAMS = 8  # unfinished streams of one session's kernels (the next is refused)
EVICTED = "stream expired or evicted: open it again"  # a reader's not-found (the CLI matches it)
TIMEOUT_CODE = 124  # an exec killed at its timeout, as coreutils' timeout


class Stream:
    def __init__(self, stream_id: str, limit: int, session_id: str = "") -> None:
        self.id = stream_id
        self.limit = limit
        self.session_id = session_id  # the kernel's session: its streams count against its cap
        self.data = bytearray()
        self.start = 0  # absolute offset of data[0]
        self.done = False
        self.exit_code: int | None = None
        self.reason: str | None = None
        self.opened_at = self.read_at = time.monotonic()
        self.readers = 0  # stream-reads waiting on it now: it is not idle while there are any
        self.delivered = False  # a read returned its last chunk
        self.task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    @property
    def used_at(self) -> float:
        """When it was last opened or read: the least recently used goes first."""
        return max(self.opened_at, self.read_at)

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def write(self, chunk: bytes) -> None:
        self.data += chunk
        if (excess := len(self.data) - self.limit) > 0:
            del self.data[:excess]
            self.start += excess
        self._changed.set()

    def finish(self, exit_code: int | None = None, reason: str | None = None) -> None:
        if self.done:
            return
        self.done, self.exit_code, self.reason = True, exit_code, reason
        self._changed.set()

    async def read(self, cursor: int, wait: float, max_bytes: int) -> rpc.StreamChunk:
        self.read_at = time.monotonic()
        if cursor > self.end:
            raise rpc.RequestError(
                "invalid-request", f"cursor {cursor} is past the stream's end ({self.end})"
            )
        if cursor == self.end and not self.done and wait > 0:
            self._changed.clear()
            self.readers += 1
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._changed.wait()
            finally:
                self.readers -= 1
        dropped = max(0, self.start - cursor)
        cursor = max(cursor, self.start)
        data = bytes(self.data[cursor - self.start : cursor - self.start + max_bytes])
        cursor += len(data)
        done = self.done and cursor == self.end
        self.delivered = self.delivered or done
        self.read_at = time.monotonic()
        return rpc.StreamChunk(
            data=data,
            cursor=cursor,
            dropped=dropped,
            done=done,
            exit_code=self.exit_code if done else None,
            reason=self.reason if done else None,
        )


class Streams:
    """The agent's open streams."""

    def __init__(
        self,
        agent_id: str,
        idle_s: float = IDLE_S,
        limit: int = BUFFER_BYTES,
        max_streams: int = MAX_STREAMS,
        max_session_streams: int = MAX_SESSION_STREAMS,
    ) -> None:
        self.agent_id = agent_id
        self.idle_s = idle_s
        self.limit = limit
        self.max_streams = max_streams
        self.max_session_streams = max_session_streams
        self.open: dict[str, Stream] = {}
        self._tasks = Tasks()

    def start(self) -> None:
        self._tasks.spawn(
            every(min(1.0, self.idle_s / 4), self.expire, f"agent {self.agent_id}: streams"),
            name="stream expiry",
        )

    async def stop(self) -> None:
        await self._tasks.stop()
        self.open.clear()

    def _new(self, session_id: str) -> Stream:
        # Finished streams (read to their end) are kept for a repeated last read, but do not
        # count against their session.
        mine = [s for s in self.open.values() if s.session_id == session_id and not s.delivered]
        if len(mine) >= self.max_session_streams:
            raise rpc.RequestError(
                "conflict",
                f"session {session_id} has {len(mine)} streams open on agent {self.agent_id},"
                f" the most one session keeps: read them to their end, or wait for the"
                f" unread ones to close after {self.idle_s:g}s idle (idle_s)",
            )
        while len(self.open) >= self.max_streams:
            self._evict()
        stream = Stream(secrets.token_hex(16), self.limit, session_id)
        self.open[stream.id] = stream
        return stream

    def _evict(self) -> None:
        """Close the stream least recently used (finished ones first); never one a read waits
        on, nor an exec's whose command is still starting."""
        candidates = [s for s in self.open.values() if not s.readers and s.task is not None]
        if not candidates:
            raise rpc.RequestError(
                "conflict",
                f"agent {self.agent_id} has {len(self.open)} streams open, the most it keeps,"
                " and every one is being read: retry in a few seconds",
            )
        victim = min(candidates, key=lambda s: (not s.delivered, s.used_at))
        log.info(
            "stream %s (session %s) evicted: agent %s keeps %d streams",
            victim.id,
            victim.session_id,
            self.agent_id,
            self.max_streams,
        )
        self._close(victim)

    def _run(self, stream: Stream, producer: Coroutine[Any, Any, None]) -> Stream:
        stream.task = self._tasks.spawn(producer, name=f"stream {stream.id}")
        return stream

    def logs(self, output: AsyncIterator[bytes], session_id: str) -> Stream:
        stream = self._new(session_id)
        return self._run(stream, _copy_logs(stream, output))

    async def exec(
        self, start: Callable[[], Awaitable[ExecRun]], limit_s: float, session_id: str
    ) -> Stream:
        """Start a command with ``start`` once there is room for its stream."""
        stream = self._new(session_id)
        try:
            run = await start()
        except BaseException:
            self.open.pop(stream.id, None)
            raise
        return self._run(stream, _copy_exec(stream, run, limit_s))

    def get(self, stream_id: str) -> Stream:
        stream = self.open.get(stream_id)
        if stream is None:
            raise rpc.RequestError(
                "not-found",
                f"{EVICTED} (no stream {stream_id} on agent {self.agent_id}: it was"
                f" evicted to make room, ended, or nobody read it for {self.idle_s:g}s)",
            )
        return stream

    def expire(self) -> None:
        now = time.monotonic()
        for stream in list(self.open.values()):
            if not stream.readers and now - stream.read_at > self.idle_s:
                self._close(stream)

    def _close(self, stream: Stream) -> None:
        self.open.pop(stream.id, None)
        if stream.task is not None:
            stream.task.cancel()  # its producer kills an exec's command
        stream.finish(reason="closed")


async def _copy_logs(stream: Stream, output: AsyncIterator[bytes]) -> None:
    try:
        async for chunk in output:
            stream.write(chunk)
        stream.finish()
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.warning("stream %s: logs failed: %s", stream.id, e)
        stream.finish(reason=f"{type(e).__name__}: {e}")
    finally:
        aclose = getattr(output, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


async def _copy_exec(stream: Stream, run: ExecRun, limit_s: float) -> None:
    try:
        async with asyncio.timeout(limit_s):
            async for chunk in run.output():
                stream.write(chunk)
            code = await run.wait()
        stream.finish(exit_code=code)
    except TimeoutError:
        with contextlib.suppress(Exception):
            await run.kill()
        stream.finish(exit_code=TIMEOUT_CODE, reason=f"timed out after {limit_s:g}s")
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await run.kill()
        raise
    except Exception as e:
        log.warning("stream %s: exec failed: %s", stream.id, e)
        with contextlib.suppress(Exception):
            await run.kill()
        stream.finish(reason=f"{type(e).__name__}: {e}")
