"""How the web view's HTTP server holds up against clients that hold connections open: uvicorn's
own limits, a header-read deadline it lacks, a cap on open connections, and a log a flood
cannot fill.

uvicorn (h11) closes an idle keep-alive connection after ``timeout_keep_alive``, but it arms
that timer only after a response: a connection that sends nothing, or a header a byte at a
time, was never closed.  ``GuardedH11`` closes any connection whose request head is not in
within ``HEADER_TIMEOUT_S`` of its opening (or of its last response), and closes at once any
connection beyond ``MAX_CONNECTIONS``, so the process keeps file descriptors for its NATS
connections and its real pages.  ``limit_concurrency`` answers 503 beyond the same number of
requests in flight; h11 refuses a request head over ``MAX_HEAD_BYTES``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0  # a request head must be in this long after the connection opened
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this
MAX_CONNECTIONS = 512  # open connections at most (the next ones are closed at once)
MAX_HEAD_BYTES = 16 * 1024  # a request line and headers (a Basic login and the cookie fit)
LOG_BURST = 5  # log records of one kind passed per LOG_WINDOW_S, the rest counted
LOG_WINDOW_S = 10.0


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a header-read deadline and a cap on open connections."""

    header_timeout_s = HEADER_TIMEOUT_S
    max_connections = MAX_CONNECTIONS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_deadline: asyncio.TimerHandle | None = None
        if len(self.connections) > self.max_connections:
            transport.abort()  # no room: closed before it costs more than its accept
            return
        self._arm_head_deadline()

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        waiting_for = self.cycle  # a new request's head makes a new cycle
        self._head_deadline = self.loop.call_later(
            self.header_timeout_s, self._head_overdue, waiting_for
        )

    def _head_overdue(self, waiting_for: Any) -> None:
        self._head_deadline = None
        if self.cycle is waiting_for and not self.transport.is_closing():
            self.transport.close()  # no request head in time: nothing to answer

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_deadline()  # the next request's head, if any, has as long

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_head_deadline", None) is not None:
            self._head_deadline.cancel()  # type: ignore[union-attr]
            self._head_deadline = None
        super().connection_lost(exc)


def server_config(app: Any, host: str, port: int, log_level: str = "warning") -> uvicorn.Config:
    """The uvicorn configuration the web view serves with."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        lifespan="off",
        timeout_graceful_shutdown=1,
        http=GuardedH11,
        timeout_keep_alive=KEEP_ALIVE_S,
        limit_concurrency=MAX_CONNECTIONS,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
    )


class RateLimited(logging.Filter):
    """Passes at most ``burst`` records of one kind (logger and message template) per
    ``window_s``; the next one passed says how many were left out.  A flood of connections
    (each failing alike, e.g. "Too many open files") then costs a few lines, not a traceback
    each."""

    def __init__(
        self,
        burst: int = LOG_BURST,
        window_s: float = LOG_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self.clock = clock
        self._kinds: dict[tuple[str, str], list[float]] = {}  # -> [window start, passed, left]

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, str(record.msg))
        now = self.clock()
        state = self._kinds.get(kind)
        if state is None or now - state[0] >= self.window_s:
            left_out = int(state[2]) if state is not None else 0
            state = [now, 0, 0]
            self._kinds[kind] = state
            if len(self._kinds) > 1000:  # kinds come from code, but stay bounded
                self._kinds = {kind: state}
            if left_out:
                record.msg = f"{record.msg} ({left_out} more like it left out of the log)"
        if state[1] >= self.burst:
            state[2] += 1
            return False
        state[1] += 1
        return True


def quiet_floods(root: logging.Logger | None = None) -> None:
    """Rate-limit every record the root logger's handlers write."""
    for handler in (root or logging.getLogger()).handlers:
        handler.addFilter(RateLimited())
