"""Output streams the agent serves (``logs`` and ``exec``), read with ``stream-read``.

One ``Stream`` per open stream: a producer task appends what the runtime yields to a bounded
buffer and never waits for a reader (a slow reader never blocks the agent: what it fell too far
behind to get is counted as ``dropped``).  A reader asks for the bytes from its cursor.  A stream
nobody read for ``idle_s`` (and no read waits on) is closed: its producer is cancelled (an exec's
command is killed).
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
from services.transport.tasks import Tasks, every

log = logging.getLogger(__name__)

BUFFER_BYTES = 1024 * 1024  # kept per stream
IDLE_S = 30.0
MAX_STREAMS = 64  # open per agent
TIMEOUT_CODE = 124  # an exec killed at its timeout, as coreutils' timeout


class Stream:
    def __init__(self, stream_id: str, limit: int) -> None:
        self.id = stream_id
        self.limit = limit
        self.data = bytearray()
        self.start = 0  # absolute offset of data[0]
        self.done = False
        self.exit_code: int | None = None
        self.error: str | None = None
        self.read_at = time.monotonic()
        self.readers = 0  # stream-reads waiting on it now: it is not idle while there are any
        self.delivered = False  # a read returned its last chunk
        self.task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def write(self, chunk: bytes) -> None:
        self.data += chunk
        if (excess := len(self.data) - self.limit) > 0:
            del self.data[:excess]
            self.start += excess
        self._changed.set()

    def finish(self, exit_code: int | None = None, error: str | None = None) -> None:
        if self.done:
            return
        self.done, self.exit_code, self.error = True, exit_code, error
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
            error=self.error if done else None,
        )


class Streams:
    """The agent's open streams."""

    def __init__(
        self,
        agent_id: str,
        idle_s: float = IDLE_S,
        limit: int = BUFFER_BYTES,
        max_streams: int = MAX_STREAMS,
    ) -> None:
        self.agent_id = agent_id
        self.idle_s = idle_s
        self.limit = limit
        self.max_streams = max_streams
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

    def _new(self) -> Stream:
        if len(self.open) >= self.max_streams:
            # Make room with one a reader already read to its end.
            finished = [s for s in self.open.values() if s.delivered]
            if not finished:
                raise rpc.RequestError(
                    "conflict",
                    f"agent {self.agent_id} has {len(self.open)} streams open, the most it"
                    f" keeps: read them to their end, or retry after {self.idle_s:g}s"
                    " (unread streams close then)",
                )
            self._close(min(finished, key=lambda s: s.read_at))
        stream = Stream(secrets.token_hex(16), self.limit)
        self.open[stream.id] = stream
        return stream

    def _run(self, stream: Stream, producer: Coroutine[Any, Any, None]) -> Stream:
        stream.task = self._tasks.spawn(producer, name=f"stream {stream.id}")
        return stream

    def logs(self, output: AsyncIterator[bytes]) -> Stream:
        stream = self._new()
        return self._run(stream, _copy_logs(stream, output))

    async def exec(self, start: Callable[[], Awaitable[ExecRun]], limit_s: float) -> Stream:
        """Start a command with ``start`` once there is room for its stream."""
        stream = self._new()
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
                f"no stream {stream_id} on agent {self.agent_id}: it ended, or nobody read it"
                f" for {self.idle_s:g}s",
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
        stream.finish(error="closed")


async def _copy_logs(stream: Stream, output: AsyncIterator[bytes]) -> None:
    try:
        async for chunk in output:
            stream.write(chunk)
        stream.finish()
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.warning("stream %s: logs failed: %s", stream.id, e)
        stream.finish(error=f"{type(e).__name__}: {e}")
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
        stream.finish(exit_code=TIMEOUT_CODE, error=f"timed out after {limit_s:g}s")
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await run.kill()
        raise
    except Exception as e:
        log.warning("stream %s: exec failed: %s", stream.id, e)
        with contextlib.suppress(Exception):
            await run.kill()
        stream.finish(error=f"{type(e).__name__}: {e}")
