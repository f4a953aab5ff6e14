"""The web view's server against clients that hold connections open (no stack): idle and
half-sent connections are closed, open connections are capped, one login's event streams are
capped, and a flood of like log records costs a few lines."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn

from services.stack.natsserver import free_port
from services.web.app import MAX_STREAMS, Principal, make_app
from services.web.serve import GuardedH11, RateLimited, server_config
from tests.web.test_page import ADMIN_SECTIONS, FixedAccess, FixedHub

IDLE = 200  # connections that send nothing
HALF = 100  # connections that send half a request head


class QuickHeads(GuardedH11):
    header_timeout_s = 1.0
    max_connections = IDLE + HALF + 20


@pytest.fixture
async def served() -> AsyncIterator[tuple[FixedAccess, int]]:
    access = FixedAccess(token="t" * 24, admin=None, nats_url="")  # type: ignore[arg-type]
    access.now = Principal(FixedHub("admin (token)", True, dict(ADMIN_SECTIONS)))
    port = free_port()
    config = server_config(make_app(access), "127.0.0.1", port)
    config.http = QuickHeads
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        assert not serving.done(), "the view did not start"
        await asyncio.sleep(0.02)
    yield access, port
    server.should_exit = True
    with contextlib.suppress(asyncio.CancelledError):
        await serving


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        async with asyncio.timeout(seconds):
            return await reader.read(1024) == b""
    except TimeoutError:
        return False


async def test_idle_and_half_sent_connections_are_closed(served: tuple[Any, int]) -> None:
    _, port = served
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(IDLE + HALF)]
    for _, writer in conns[IDLE:]:
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # and never the rest
    await asyncio.gather(*(w.drain() for _, w in conns))
    closed = await asyncio.gather(*(closed_within(r, 4) for r, _ in conns))
    assert all(closed), f"{closed.count(False)} of {len(conns)} still open"
    # Beyond the cap a connection is closed at once, the others keep being served.
    extra = [
        await asyncio.open_connection("127.0.0.1", port)
        for _ in range(QuickHeads.max_connections + 10)
    ]
    closed = await asyncio.gather(*(closed_within(r, 0.5) for r, _ in extra))
    assert closed.count(True) >= 10, closed.count(True)
    for _, writer in conns + extra:
        writer.close()
    await asyncio.sleep(0.2)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        assert (await http.get("/")).status_code == 200


async def test_one_login_opens_at_most_so_many_event_streams(served: tuple[Any, int]) -> None:
    _, port = served
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}",
                timeout=5,
                limits=httpx.Limits(max_connections=MAX_STREAMS + 5),
            )
        )
        for _ in range(MAX_STREAMS):
            opened = await stack.enter_async_context(http.stream("GET", "/events"))
            assert opened.status_code == 200
        refused = await http.get("/events")
        assert refused.status_code == 429 and "too many open event streams" in refused.text
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        await asyncio.sleep(0.3)  # the closed streams gave their count back
        async with http.stream("GET", "/events") as again:
            assert again.status_code == 200


def test_a_flood_of_like_records_costs_a_few_lines() -> None:
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("test.web.flood")
    logger.propagate = False
    handler = Keep()
    now = [0.0]  # the window's clock: a loaded host may take longer than a window for the flood
    limited = RateLimited(burst=3, window_s=0.2, clock=lambda: now[0])
    handler.addFilter(limited)
    logger.addHandler(handler)
    try:
        for _ in range(10_000):
            logger.error("accept failed: %s", "Too many open files")
        assert len(seen) == 3
        now[0] += 0.25
        logger.error("accept failed: %s", "Too many open files")
        assert seen[-1].endswith("(9997 more like it left out of the log)"), seen[-1]
    finally:
        logger.removeHandler(handler)
