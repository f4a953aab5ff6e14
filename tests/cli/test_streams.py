"""The stream-reading loop of run/logs/exec against scripted replies: cursors, dropped bytes,
the last chunk, a closed output and Ctrl-C."""

from __future__ import annotations

import asyncio
import base64
import io
from typing import Any, cast

import pytest

from services.cli.connection import Connection
from services.cli.streams import read_stream

OPENED = {"agent_id": "agent-1", "stream_id": "s1", "idle_s": 30.0}


class Scripted:
    """Answers stream reads with ``chunks`` in order, recording each request; then hangs."""

    def __init__(self, chunks: list[dict[str, Any]]) -> None:
        self.chunks = chunks
        self.asked: list[dict[str, Any]] = []

    async def request(self, subject: str, payload: dict[str, Any], wait_s: float = 10) -> Any:
        self.asked.append(payload)
        if not self.chunks:
            await asyncio.Event().wait()
        return self.chunks.pop(0)


def chunk(data: bytes, cursor: int, **more: Any) -> dict[str, Any]:
    return {"data": base64.b64encode(data).decode(), "cursor": cursor, "dropped": 0, **more}


async def test_reads_from_each_cursor_and_says_what_was_dropped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    conn = Scripted(
        [
            chunk(b"a\n", 2),
            chunk(b"", 2),  # a wait that ran out
            chunk(b"z\n", 12, dropped=8),
            chunk(b"", 12, done=True, exit_code=4),
        ]
    )
    out = io.BytesIO()
    end = await read_stream(cast(Connection, conn), OPENED, asyncio.Event(), out)
    assert out.getvalue() == b"a\nz\n"
    assert (end.exit_code, end.dropped, end.interrupted) == (4, 8, False)
    assert [a["cursor"] for a in conn.asked] == [0, 2, 2, 12]
    assert all(a["wait"] > 0 and a["stream_id"] == "s1" for a in conn.asked)
    assert "8 bytes dropped: the reader fell behind" in capsys.readouterr().err


async def test_a_closed_output_and_an_interrupt_end_the_loop() -> None:
    class Closed(io.BytesIO):
        def write(self, data: Any) -> int:
            raise BrokenPipeError

    conn = Scripted([chunk(b"x", 1)])
    end = await read_stream(cast(Connection, conn), OPENED, asyncio.Event(), Closed())
    assert end.pipe_closed

    stop = asyncio.Event()
    conn = Scripted([])  # the read waits on the agent
    reading = asyncio.create_task(read_stream(cast(Connection, conn), OPENED, stop, io.BytesIO()))
    await asyncio.sleep(0.05)
    stop.set()
    end = await asyncio.wait_for(reading, 5)
    assert end.interrupted
