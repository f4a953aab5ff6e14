"""The agent's stream limits without NATS: a per-session cap, eviction of the least recently
used stream when the agent is full (never one a read waits on), and the chunk's ``reason``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest

from agent import streams as agent_streams
from agent.streams import Streams
from domain import rpc
from services.cli import streams as cli_streams


async def quiet() -> AsyncIterator[bytes]:
    await asyncio.Event().wait()
    yield b""


async def test_stream_limits_are_per_session_and_a_full_agent_evicts_the_least_used() -> None:
    streams = Streams("a1", max_streams=3, max_session_streams=2)
    try:
        a = streams.logs(quiet(), "s1")
        b = streams.logs(quiet(), "s1")
        with pytest.raises(rpc.RequestError) as refused:
            streams.logs(quiet(), "s1")
        assert refused.value.code == "conflict"
        assert "session s1 has 2 streams open on agent a1" in refused.value.message
        c = streams.logs(quiet(), "s2")
        await a.read(0, 0, 10)  # a is used now: b is the least recently used
        d = streams.logs(quiet(), "s2")
        assert set(streams.open) == {a.id, c.id, d.id}
        assert b.done and b.reason == "closed"
        with pytest.raises(rpc.RequestError) as gone:
            streams.get(b.id)
        assert gone.value.code == "not-found"
        assert gone.value.message.startswith(agent_streams.EVICTED)
        # The CLI knows the words (it opens logs again on them).
        assert agent_streams.EVICTED.startswith(cli_streams.EVICTED)
    finally:
        await streams.stop()


async def test_a_stream_read_to_its_end_goes_first_and_does_not_count_for_its_session() -> None:
    streams = Streams("a1", max_streams=2, max_session_streams=1)
    try:
        one = streams.logs(quiet(), "s1")
        one.finish()
        assert (await one.read(0, 0, 10)).done  # delivered
        two = streams.logs(quiet(), "s1")  # the finished one does not count
        await one.read(0, 0, 10)  # read again (most recently used), but finished: goes first
        three = streams.logs(quiet(), "s2")
        assert set(streams.open) == {two.id, three.id}
    finally:
        await streams.stop()


async def test_a_stream_with_a_reader_waiting_is_never_evicted() -> None:
    streams = Streams("a1", max_streams=2)
    try:
        old = streams.logs(quiet(), "s1")
        new = streams.logs(quiet(), "s2")
        reading = asyncio.create_task(old.read(0, 5.0, 10))
        await asyncio.sleep(0.05)
        third = streams.logs(quiet(), "s3")  # evicts `new`, though `old` was opened first
        assert set(streams.open) == {old.id, third.id} and new.done
        reading_too = asyncio.create_task(third.read(0, 5.0, 10))
        await asyncio.sleep(0.05)
        with pytest.raises(rpc.RequestError) as full:
            streams.logs(quiet(), "s4")
        assert full.value.code == "conflict" and "every one is being read" in full.value.message
        reading.cancel()
        reading_too.cancel()
    finally:
        await streams.stop()


async def test_an_exec_timeout_chunk_says_reason_not_error() -> None:
    """A failure envelope is {"error": {...}}; a chunk that ended early must not look like one."""

    class Slow:
        async def output(self) -> AsyncIterator[bytes]:
            await asyncio.sleep(5)
            yield b""

        async def wait(self) -> int:
            return 0

        async def kill(self) -> None:
            pass

    streams = Streams("a1")
    try:

        async def start() -> Slow:
            return Slow()

        stream = await streams.exec(start, 0.1, "s1")  # type: ignore[arg-type]
        chunk = await stream.read(0, 2.0, 10)
        assert (chunk.done, chunk.exit_code, chunk.reason) == (True, 124, "timed out after 0.1s")
        wire = msgspec.json.decode(rpc.encode(chunk))
        assert "error" not in wire and wire["reason"] == "timed out after 0.1s", wire
    finally:
        await streams.stop()
