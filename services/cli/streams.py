"""Reading an output stream (``hoist.api.stream.read``): the one loop `hoist run`, `hoist logs`
and `hoist exec` print a kernel's output with.

The reader sets the pace: each read asks for the bytes after its cursor, waiting on the agent
up to a few seconds when there are none yet.  The agent keeps a bounded buffer per stream and
never waits for us; bytes we fell too far behind to get come back as ``dropped`` (said on
stderr, so stdout holds only the output).  Ctrl-C and a closed stdout (``| head``) end the loop
without a traceback.  A stream the agent no longer has (unread for its ``idle_s``, or evicted
to make room for others) ends the loop with ``StreamEnd.lost``: the caller decides whether to
open it again (``skip`` then passes over what was printed already).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from client.connection import CliError, Connection
from domain.subjects import STREAM_READ

T = TypeVar("T")
MAX_WAIT_S = 10.0  # a read waits at most this long on the agent (the contract allows 30)
REPLY_MARGIN_S = 15.0  # on top of the wait: the manager relays the read to the agent
# The start of the agent's not-found for a stream it expired or evicted (agent.streams.EVICTED).
EVICTED = "stream expired or evicted"


@dataclass
class StreamEnd:
    """How reading a stream ended."""

    exit_code: int | None = None  # an exec's (with done)
    reason: str | None = None  # why the stream ended early (timed out, closed)
    interrupted: bool = False  # Ctrl-C or SIGTERM
    pipe_closed: bool = False  # whoever read our stdout went away
    dropped: int = 0  # bytes the agent's buffer lost before we read them
    lost: str | None = None  # the agent no longer has the stream (expired, evicted): its words
    cursor: int = 0  # how far into the stream we got (bytes printed, skipped or dropped)


def interrupt_event() -> asyncio.Event:
    """Set on Ctrl-C or SIGTERM, instead of raising inside whatever runs.  Signals reach only
    the main thread: on another (a command run in-process, as the CLI tests do) none can set it,
    and asyncio refuses the handlers there."""
    event = asyncio.Event()
    if threading.current_thread() is threading.main_thread():
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, event.set)
    return event


async def until_stopped(aw: Awaitable[T], stop: asyncio.Event) -> T | None:
    """``aw``'s result, or None (``aw`` cancelled) once ``stop`` is set first."""
    task = asyncio.ensure_future(aw)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
    if not task.cancelled() and task.done():
        return task.result()
    with contextlib.suppress(asyncio.CancelledError):
        await task  # let it unwind (its request's futures) before the caller goes on
    return None


def silence_stdout() -> None:
    """Point stdout at /dev/null once its reader is gone, so the interpreter's final flush does
    not raise BrokenPipeError again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


async def read_stream(
    conn: Connection,
    opened: Mapping[str, Any],
    stop: asyncio.Event,
    out: BinaryIO | None = None,
    skip: int = 0,
) -> StreamEnd:
    """Copy the stream ``opened`` (a ``StreamOpened`` reply) to ``out`` (stdout) until it is
    done, ``stop`` is set, ``out`` is closed or the agent no longer has it (``lost``).  The
    first ``skip`` bytes are not printed (a stream opened again after one was lost)."""
    out = out if out is not None else sys.stdout.buffer
    # Reads must come more often than the agent's idle expiry, or it drops the stream.
    wait = max(0.5, min(MAX_WAIT_S, float(opened.get("idle_s", 30.0)) / 3))
    cursor, dropped = 0, 0
    while True:
        payload = {
            "agent_id": opened["agent_id"],
            "stream_id": opened["stream_id"],
            "cursor": cursor,
            "wait": wait,
        }
        try:
            chunk = await until_stopped(
                conn.request(STREAM_READ, payload, wait_s=wait + REPLY_MARGIN_S), stop
            )
        except CliError as e:
            if EVICTED not in str(e):
                raise
            return StreamEnd(lost=str(e), dropped=dropped, cursor=cursor)
        if chunk is None:
            return StreamEnd(interrupted=True, dropped=dropped, cursor=cursor)
        data = base64.b64decode(chunk.get("data") or "")
        start = cursor + (chunk.get("dropped") or 0)  # where data begins: [cursor, start) lost
        if lost := max(0, start - max(cursor, skip)):
            dropped += lost
            print(
                f"hoist: … {lost} bytes dropped: the reader fell behind",
                file=sys.stderr,
                flush=True,
            )
        data = data[max(0, skip - start) :]
        if data:
            try:
                out.write(data)
                out.flush()
            except BrokenPipeError:
                if out is sys.stdout.buffer:
                    silence_stdout()
                return StreamEnd(pipe_closed=True, dropped=dropped, cursor=cursor)
        if chunk["cursor"] < cursor:
            raise CliError(
                f"stream {opened['stream_id']}: the agent went back to {chunk['cursor']}"
            )
        cursor = chunk["cursor"]
        if chunk.get("done"):
            return StreamEnd(
                exit_code=chunk.get("exit_code"),
                reason=chunk.get("reason"),
                dropped=dropped,
                cursor=cursor,
            )


def process_exit(code: int) -> int:
    """A kernel's exit code as this process's (a shell sees 0-255)."""
    return code if 0 <= code <= 255 else 1
