"""The stream-reading loop of run/logs/exec against scripted replies: cursors, dropped bytes,
the last chunk, a closed output and Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import signal
import threading
from typing import Any, cast

import pytest

from client.connection import CliError, Connection
from domain.status import KernelStatus
from domain.subjects import SESSION_GET, SESSION_LOGS, STREAM_READ
from services.cli.kernels import cmd_exec, cmd_logs
from services.cli.progress_view import Outcome
from services.cli.streams import EVICTED as EVICTED_WORDS
from services.cli.streams import interrupt_event, read_stream

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


# -- a stream the agent expired or evicted ------------------------------------------------------

EVICTED = "agent agent-1: stream expired or evicted: open it again (no stream s1) (not-found)"


class Agent:
    """Answers logs/exec opens and stream reads: each opened stream gives the bytes of
    ``streams`` in turn from its cursor, a CliError like the agent's not-found where the script
    says the stream was lost, then its last chunk."""

    def __init__(self, streams: list[list[bytes | None]], last: dict[str, Any]) -> None:
        self.streams = streams  # per open, its chunks; None: the agent lost the stream there
        self.last = last
        self.opens: list[tuple[str, dict[str, Any]]] = []
        self.current: list[bytes | None] = []

    async def request(self, subject: str, payload: dict[str, Any], wait_s: float = 10) -> Any:
        if subject != STREAM_READ:
            self.opens.append((subject, dict(payload)))
            self.current = self.streams.pop(0)
            return {**OPENED, "kernel_id": "k1", "stream_id": f"s{len(self.opens)}"}
        if not self.current:
            return chunk(b"", payload["cursor"], done=True, **self.last)
        data = self.current.pop(0)
        if data is None:
            raise CliError(EVICTED)
        return chunk(data, payload["cursor"] + len(data))


def logs_args(**more: Any) -> argparse.Namespace:
    return argparse.Namespace(
        **{"session_id": "sess", "follow": False, "kernel": None, "tail": None, **more}
    )


async def test_a_lost_stream_ends_the_loop_with_how_far_it_got() -> None:
    conn = Agent([], {})
    conn.current = [b"abc", None]  # opened already
    end = await read_stream(cast(Connection, conn), OPENED, asyncio.Event(), io.BytesIO())
    assert end.lost == EVICTED and end.cursor == 3 and not end.interrupted
    assert EVICTED_WORDS in EVICTED


async def test_skip_passes_over_what_was_printed_and_counts_drops_after_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    conn = Scripted([chunk(b"abcd", 4), chunk(b"ij", 10, dropped=4), chunk(b"", 10, done=True)])
    out = io.BytesIO()
    end = await read_stream(cast(Connection, conn), OPENED, asyncio.Event(), out, skip=6)
    assert out.getvalue() == b"ij" and end.cursor == 10
    assert end.dropped == 2 and "2 bytes dropped" in capsys.readouterr().err  # 6..8


async def test_logs_open_a_lost_stream_again_without_printing_twice(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    conn = Agent([[b"one\n", b"two\n", None], [b"one\n", b"tw", b"o\nthree\n"]], {})
    assert await cmd_logs(cast(Connection, conn), logs_args()) == 0
    captured = capsysbinary.readouterr()
    assert captured.out == b"one\ntwo\nthree\n" and captured.err == b""
    assert [p for _, p in conn.opens] == [
        {"session_id": "sess", "follow": False},
        {"session_id": "sess", "follow": False, "kernel_id": "k1"},  # the same kernel
    ]


async def test_logs_follow_says_output_was_lost_and_follows_new_output(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    conn = Agent([[b"one\n", None], [b"five\n"]], {})
    assert await cmd_logs(cast(Connection, conn), logs_args(follow=True, tail=3)) == 0
    captured = capsysbinary.readouterr()
    assert captured.out == b"one\nfive\n"
    assert b"output may be missing here; following new output" in captured.err
    assert conn.opens[1][1] == {"session_id": "sess", "follow": True, "tail": 0, "kernel_id": "k1"}


async def test_logs_give_up_on_a_stream_lost_again_and_again() -> None:
    conn = Agent([[None], [None], [None]], {})
    with pytest.raises(CliError, match="stream expired or evicted"):
        await cmd_logs(cast(Connection, conn), logs_args())
    assert len(conn.opens) == 3
    conn = Agent([[b"x", None]], {})
    with pytest.raises(CliError, match="last 5 lines may differ now"):
        await cmd_logs(cast(Connection, conn), logs_args(tail=5))


async def test_an_exec_whose_stream_is_lost_says_so_and_fails() -> None:
    conn = Agent([[b"partial\n", None]], {})
    args = argparse.Namespace(
        session_id="sess", cmd=["sleep", "9"], words=[], timeout=60.0, kernel=None, env=None,
        workdir=None,
    )  # fmt: skip
    with pytest.raises(CliError) as lost:
        await cmd_exec(cast(Connection, conn), args)
    assert "the rest of the output and the exit code are lost" in str(lost.value)
    assert "command was killed" in str(lost.value)


async def test_an_exec_timeout_is_said_from_the_chunks_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    conn = Agent([[b"x"]], {"exit_code": 124, "reason": "timed out after 1s"})
    args = argparse.Namespace(
        session_id="sess", cmd=["sleep", "9"], words=[], timeout=1.0, kernel=None, env=None,
        workdir=None,
    )  # fmt: skip
    assert await cmd_exec(cast(Connection, conn), args) == 124
    assert "hoist: exec: timed out after 1s" in capsys.readouterr().err


@pytest.mark.parametrize("lost_at", ["open", "read"])
async def test_an_attached_run_that_loses_its_output_says_so_and_exits_with_the_kernels_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], lost_at: str
) -> None:
    from services.cli import main

    async def watch(*args: Any, **kwargs: Any) -> Outcome:
        return Outcome(KernelStatus.RUNNING, "running")

    class Stack(Agent):
        async def request(self, subject: str, payload: dict[str, Any], wait_s: float = 10) -> Any:
            if subject == SESSION_GET:
                kernel = {"kernel_id": "k1", "status": "TERMINATED", "exit_code": 3}
                return {"status": "TERMINATED", "status_info": "exited: code 3",
                        "kernels": [kernel]}  # fmt: skip
            if subject == SESSION_LOGS and lost_at == "open":
                raise CliError("session sess has 8 streams open on agent a1 (conflict)")
            return await super().request(subject, payload, wait_s)

    monkeypatch.setattr(main, "watch", watch)
    conn = Stack([[b"hello\n", None]], {})
    created = {"session_id": "sess", "created": True}  # the create's reply
    code = await main._run_attached(cast(Connection, conn), created, 5.0, asyncio.Event())
    assert code == 3
    err = capsys.readouterr().err
    assert err.startswith("session sess created (Ctrl-C detaches; it goes on)"), err
    assert "`hoist logs sess` reads" in err, err
    if lost_at == "read":
        assert "was lost on its agent" in err and "after 6 bytes" in err
    else:
        assert "8 streams open" in err


def test_a_command_run_off_the_main_thread_sets_no_signal_handler() -> None:
    """Signals reach only the main thread, and asyncio and signal.signal refuse handlers on any
    other: a command run there (the CLI tests run `hoist` in-process so) still runs, with an
    interrupt event nothing sets, and leaves the process's SIGTERM handler as it was."""
    from services.cli import main

    before = signal.getsignal(signal.SIGTERM)
    interrupted: list[bool] = []
    codes: list[int] = []

    async def command(args: argparse.Namespace) -> int:
        interrupted.append(interrupt_event().is_set())
        return 7

    thread = threading.Thread(target=lambda: codes.append(main.run(command, argparse.Namespace())))
    thread.start()
    thread.join(10)
    assert codes == [7] and interrupted == [False]
    assert signal.getsignal(signal.SIGTERM) is before
